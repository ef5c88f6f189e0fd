"""Agent definition fingerprints (stable in every process, moved only by what a running turn depends on) and the
compatibility rule, case by case (stepq.agents.compatibility)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from stepq.agents.compatibility import PendingCall, Verdict, compare
from stepq.agents.definition import AgentDefinition
from stepq.agents.fingerprint import digest, version_of
from stepq.agents.tools import ToolDefinition, tool
from stepq.models import AgentVersion
from tests.conftest import ROOT


@tool
def av_lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"order_id": order_id}


@tool(is_mutation=True)
def av_refund(order_id: str, amount: int) -> dict[str, str]:
    """Refund an order."""
    return {"order_id": order_id}


class Card(BaseModel):
    name: str


class CardWithEmail(BaseModel):
    name: str
    email: str


BASE = AgentDefinition(id="av.agent", system_prompt="Be brief.", allowed_tools=["av_lookup"], version="1")


def changed(**update: Any) -> AgentDefinition:
    return AgentDefinition(**{**BASE.model_dump(exclude={"label"}), **update})


def test_the_fingerprint_is_the_same_in_every_process_whatever_the_hash_seed() -> None:
    script = (
        "import json; from stepq.agents.registry import registry; from stepq.agents.fingerprint import version_of;"
        "registry().load_modules(['tests.deploy_agents_v1']);"
        "print(json.dumps({a: version_of(registry().get(a)).fingerprint for a in registry().ids()}))"
    )
    seen = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        seen.append(json.loads(done.stdout))
    assert seen[0] == seen[1]
    assert set(seen[0]) == {"deploy.refunds", "deploy.charges", "deploy.charges_fail"}
    assert len(set(seen[0].values())) == 2  # the two charge agents differ only in their upgrade policy


def test_what_a_running_turn_does_not_depend_on_leaves_the_fingerprint_alone() -> None:
    base = version_of(BASE).fingerprint
    same = [
        changed(system_prompt="Be very brief."),
        changed(version="2"),
        changed(description="new words"),
        changed(default_model="scripted/other"),
        changed(on_incompatible_upgrade="fail"),
    ]
    assert [version_of(a).fingerprint for a in same] == [base] * len(same)
    assert version_of(changed(version="2")).version == "2"


def test_what_a_running_turn_depends_on_moves_the_fingerprint() -> None:
    moved = {
        "a new tool": changed(allowed_tools=["av_lookup", "av_refund"], read_only=False),
        "a tool removed": changed(allowed_tools=[]),
        "the prompt version": changed(prompt_version="p2"),
        "the execution mode": changed(execution_mode="object", output=Card),
        "the mutation gate": changed(read_only=False, mutation_policy="destructive-confirm-required"),
    }
    fingerprints = {what: version_of(a).fingerprint for what, a in moved.items()}
    assert version_of(BASE).fingerprint not in fingerprints.values()
    assert len(set(fingerprints.values())) == len(moved), fingerprints
    card, with_email = (
        changed(execution_mode="object", output=Card),
        changed(execution_mode="object", output=CardWithEmail),
    )
    assert version_of(card).output != version_of(with_email).output


def test_a_copy_of_a_definition_gets_its_own_fingerprint() -> None:
    first = version_of(BASE)
    copy = BASE.model_copy(update={"allowed_tools": []})  # model_copy copies the cached value too
    assert version_of(copy).fingerprint != first.fingerprint


# --------------------------------------------------------------------------- the rule, case by case


def schema(*required: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    props = {name: {"type": "string"} for name in (*required, *optional)}
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def definition(name: str, input_schema: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition(name=name, description="", input_schema=input_schema, fn=lambda **_: None)


def version(
    tools: dict[str, dict[str, Any]],
    output: dict[str, Any] | None = None,
    mode: str = "chat",
    prompt_version: str | None = None,
    gate: str = "confirm-required",
) -> AgentVersion:
    parts = {"tools": tools, "output": output, "mode": mode, "gate": gate, "prompt": prompt_version}
    return AgentVersion(
        fingerprint=digest(parts),
        prompt_version=prompt_version,
        tools={n: digest(s)[:16] for n, s in tools.items()},
        output=digest(output)[:16] if output is not None else None,
        execution_mode=mode,
        mutation_policy=gate,
    )


def verdict(
    old_tools: dict[str, Any],
    new_tools: dict[str, Any],
    pending: list[PendingCall] | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> Verdict:
    """The rule's verdict between two definitions given as their tools' schemas (and other parts)."""
    old, new = version(old_tools, **(before or {})), version(new_tools, **(after or {}))
    return compare(old, new, {n: definition(n, s) for n, s in new_tools.items()}, pending or [])


REFUND = {"refund": schema("order_id")}
WAITING = [PendingCall("call_1", "refund", {"order_id": "A1"}, "approval", approved_args={"order_id": "A1"})]


def test_prompt_version_new_tools_and_the_mutation_gate_are_compatible() -> None:
    v = verdict(
        REFUND,
        {**REFUND, "lookup": schema("q")},
        WAITING,
        before={"prompt_version": "p1"},
        after={"prompt_version": "p2", "gate": "destructive-confirm-required"},
    )
    assert v.compatible and not v.whole_turn
    assert v.changes == [
        "prompt version p1 -> p2",
        "tool lookup added",
        "mutation policy confirm-required -> destructive-confirm-required",
    ]


def test_a_removed_tool_is_compatible_unless_the_turn_waits_on_a_call_of_it() -> None:
    assert verdict({**REFUND, "lookup": schema("q")}, REFUND, WAITING).compatible
    v = verdict(REFUND, {}, WAITING)
    assert v.blocking == ["tool refund was removed, and the turn has a pending approval (call call_1) for it"]
    client = [PendingCall("call_2", "refund", {"order_id": "A1"}, "result")]
    assert verdict(REFUND, {}, client).blocking == [
        "tool refund was removed, and the turn has a pending result (call call_2) for it"
    ]


def test_a_loosened_schema_accepts_the_stored_arguments() -> None:
    v = verdict(REFUND, {"refund": schema("order_id", optional=("note",))}, WAITING)
    assert v.compatible and v.changes == ["tool refund's argument schema changed"]


def test_a_tightened_schema_that_rejects_the_stored_arguments_is_incompatible() -> None:
    v = verdict(REFUND, {"refund": schema("order_id", "currency")}, WAITING)
    [blocking] = v.blocking
    assert blocking.startswith("tool refund's new argument schema rejects the stored arguments (")
    assert "'currency' is a required property" in blocking and blocking.endswith("of a pending approval (call call_1)")
    assert not v.whole_turn


def test_new_validation_that_changes_the_approved_arguments_is_incompatible() -> None:
    """An approval binds the validated arguments the person saw: a new default would make the resumed call refuse."""

    class RefundWithNote(BaseModel):  # as `@tool def refund(order_id: str, note: str = "")` declares it
        model_config = ConfigDict(extra="forbid")
        order_id: str
        note: str = ""

    schema_v2 = RefundWithNote.model_json_schema()
    tool_v2 = ToolDefinition(name="refund", description="", input_schema=schema_v2, fn=print, args_model=RefundWithNote)
    old, new = version(REFUND), version({"refund": schema_v2})
    v = compare(old, new, {"refund": tool_v2}, WAITING)
    assert v.blocking == [
        'tool refund\'s new argument schema turns the approved arguments {"order_id":"A1"} into '
        '{"note":"","order_id":"A1"} of a pending approval (call call_1)'
    ]
    client = [PendingCall("call_2", "refund", {"order_id": "A1"}, "result")]  # a client's result binds no arguments
    assert compare(old, new, {"refund": tool_v2}, client).compatible


def test_a_changed_schema_of_a_tool_the_turn_does_not_wait_on_is_compatible() -> None:
    assert verdict(REFUND, {"refund": schema("order_id", "currency")}).compatible


def test_a_changed_output_schema_under_an_object_mode_turn_is_incompatible_for_the_whole_turn() -> None:
    before, after = {"mode": "object", "output": schema("name")}, {"mode": "object", "output": schema("email")}
    v = verdict(REFUND, REFUND, before=before, after=after)
    assert v.blocking == ["the output schema changed under this object-mode turn"] and v.whole_turn


def test_a_changed_execution_mode_is_incompatible() -> None:
    v = verdict(REFUND, REFUND, after={"mode": "object", "output": schema("name")})
    assert v.blocking == ["execution mode chat -> object"] and v.whole_turn


@pytest.mark.parametrize("args", [{"order_id": "A1"}, {"order_id": "A1", "note": "x"}])
def test_the_stored_arguments_are_validated_as_the_resumed_call_would_be(args: dict[str, Any]) -> None:
    pending = [PendingCall("call_1", "refund", args, "approval")]
    strict = {"refund": schema("order_id")}  # additionalProperties: false
    assert verdict({"refund": schema("order_id", optional=("note",))}, strict, pending).compatible == (
        "note" not in args
    )
