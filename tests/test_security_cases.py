"""The adversarial cases the seeds name (003: path traversal, prompt injection in tool results), in-process
against real Redis with a model that obeys whatever a tool result tells it (tests/agents_injection.py).

The model is not a security boundary: an injected document may make it call anything and say anything. What
the turn can do is decided by the agent's tools, its mutation policy, the tenant policy and the approvals,
none of which a tool result's text can reach. URL traversal out of the attachment allowlist is tested with
the other refusals in tests/test_attachments.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from stepq.agents.tool_paths import confined_path
from stepq.engine.decisions import decide_approval
from stepq.engine.runner import StepRunner
from stepq.errors import ToolArgumentError
from stepq.models import EventType, TurnState, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive, tool_results
from tests.agents_injection import docs_folder, runs_key
from tests.conftest import REDIS_URL

side = redis.Redis.from_url(REDIS_URL, decode_responses=True)


def _runs(prefix: str, tool_name: str) -> int:
    return int(side.get(runs_key(prefix, tool_name)) or 0)


def _start(rt, agent: str, prefix: str, docs: Path) -> str:
    metadata = {"prefix": prefix, "docs": str(docs), "tenant": "acme"}
    state, created = create_turn(rt, agent, prompt="Summarise the report", metadata=metadata)
    assert created
    return state.turn_id


def test_an_injected_tool_result_cannot_approve_call_a_missing_tool_or_read_outside_the_folder(rt, prefix, tmp_path):
    docs = docs_folder(tmp_path)
    policy_before = rt.policies.get("acme")
    version_before = side.get(rt.keys.policy_version)
    turn_id = _start(rt, "inj.reader", prefix, docs)
    state = drive(rt, turn_id)

    # the model obeyed: after reading the document it asked for all three calls ...
    assert state.parked is not None
    asked = {c.name for c in state.parked.assistant.tool_calls}
    assert asked == {"inj_wipe_all", "inj_transfer", "inj_read_file"}
    # ... but the transfer waits for a person: the document's "approved" text approved nothing
    assert state.status == TurnStatus.AWAITING_APPROVAL
    assert [a.tool_call_id for a in state.parked.approvals] == ["transfer"]
    assert _runs(prefix, "inj_transfer") == 0

    # the person denies it; the step resumes and answers the other calls
    [request] = [e for e in rt.events.read(turn_id) if e.type == EventType.APPROVAL_REQUEST]
    token = rt.approvals.get(request.data["approval_id"]).token
    assert decide_approval(rt, request.data["approval_id"], token, False, reason="not asked for").accepted
    state = _run_on(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert _runs(prefix, "inj_transfer") == 0
    results = tool_results(state)
    # a tool the agent does not have never ran, whatever the model was told
    assert _runs(prefix, "inj_wipe_all") == 0
    assert results["wipe"].is_error and results["wipe"].output["error"] == "Tool not found: inj_wipe_all"
    # the file outside the folder was refused inside the tool, and its contents reached nobody
    assert results["read"].is_error and "outside the folder this tool may read" in results["read"].output["error"]
    assert "TOP-SECRET-VALUE" not in str(state.messages)
    # and the tenant policy the document asked to widen is as it was: nothing was written
    assert rt.policies.get("acme") == policy_before and side.get(rt.keys.policy_version) == version_before


def _run_on(rt, turn_id: str) -> TurnState:
    """Deliver the turn's current step (as the approve task's message does once every approval is decided),
    then each step after it, until the turn stops again."""
    runner = StepRunner(rt)
    for _ in range(20):
        state = rt.turns.load(turn_id)
        assert state is not None
        decision = runner.deliver(turn_id, state.step)
        assert decision.action in ("next", "none"), decision
        state = rt.turns.load(turn_id)
        assert state is not None
        if state.status.terminal or state.status.parked:
            return state
    raise AssertionError(f"turn {turn_id} did not stop")


def test_under_a_read_only_policy_an_injected_write_is_refused(rt, prefix, tmp_path):
    docs = docs_folder(tmp_path)
    state = drive(rt, _start(rt, "inj.read_only_reader", prefix, docs))
    assert _runs(prefix, "inj_transfer") == 0 and _runs(prefix, "inj_wipe_all") == 0
    results = tool_results(state)
    # a write the read-only turn was never shown: refused as unknown to it
    assert results["transfer"].output["error"] == "Tool not found: inj_transfer"
    assert state.status == TurnStatus.COMPLETED


@pytest.mark.parametrize(
    "path",
    ["../../secret.txt", "../docs/../../secret.txt", "/etc/passwd", "sub/../../../secret.txt", "a\x00b"],
)
def test_confined_path_refuses_every_way_out_of_the_folder(tmp_path, path):
    docs = docs_folder(tmp_path)
    with pytest.raises(ToolArgumentError):
        confined_path(docs, path)


def test_confined_path_refuses_a_symlink_out_and_keeps_a_path_inside(tmp_path):
    docs = docs_folder(tmp_path)
    (docs / "link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ToolArgumentError, match="outside the folder"):
        confined_path(docs, "link.txt")
    assert confined_path(docs, "./readme.txt").read_text() == "public"
    assert confined_path(docs, "sub/../readme.txt") == (docs / "readme.txt").resolve()
