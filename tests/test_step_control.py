"""Per-step control: the agent's static `active_tools` / `tool_choice`, its `prepare_step` (model, tools, tool
choice, output cap, extra system text for one step), the caller's tightening-only overrides, what the trace
records of each step, and the tool choice on each provider's wire (real SDKs against the wire fakes).
In-process against real Redis."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stepq.agents.definition import AgentDefinition
from stepq.agents.registry import AgentRegistry
from stepq.engine.runner import StepRunner
from stepq.errors import DefinitionError, OverrideError
from stepq.models import FinishReason, ToolResultStatus, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive, start, stored_keys, tool_results
from tests.agents_stepctl import PLANS, PREPARED_STEPS, REQUESTS
from tests.conftest import eventually
from tests.fakes import anthropic_server as anth
from tests.fakes import bedrock_server as bed
from tests.fakes import gemini_server as gem
from tests.fakes import openai_server as oai
from tests.test_provider_openai import fake as openai_fake  # noqa: F401 - a fixture
from tests.test_structured_output import anthropic_fake, bedrock_fake, gemini_fake  # noqa: F401 - fixtures


def _start(rt: Any, agent: str, prefix: str, **kwargs: Any) -> str:
    return start(rt, agent, prefix, prompt=f"go {prefix} {agent}", **kwargs)


def _asked(prefix: str, agent: str) -> list[dict[str, Any]]:
    return REQUESTS[f"go {prefix} {agent}"]


# --------------------------------------------------------------------------- prepare_step


def test_prepare_step_shapes_each_step_and_the_trace_records_it(rt, prefix):
    turn_id = _start(rt, "sc.prepared", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.text == "done"
    asked = _asked(prefix, "sc.prepared")
    # step 0: one tool, forced, with extra system text
    assert asked[0] == {
        "step": 0,
        "tools": ["sc_lookup"],
        "choice": "sc_lookup",
        "system": "Base prompt.\n\nLook it up first.",
    }
    # step 1: sc_write asked for but hidden by the read-only gate, so only sc_charge; the agent's own system prompt
    assert asked[1] == {"step": 1, "tools": ["sc_charge"], "choice": None, "system": "Base prompt."}
    # step 2: back to every tool the agent shows, tool choice none
    assert asked[2] == {"step": 2, "tools": ["sc_lookup", "sc_charge"], "choice": "none", "system": "Base prompt."}

    steps = state.trace.steps
    assert [s.model for s in steps] == ["function", "other-model", "function"]  # a swap lasts one step
    assert [s.tools for s in steps] == [["sc_lookup"], ["sc_charge"], ["sc_lookup", "sc_charge"]]
    assert [s.tool_choice for s in steps] == ["sc_lookup", None, "none"]
    assert [s.max_output_tokens for s in steps] == [64, 500, 500]
    assert steps[0].warnings == [] and steps[2].warnings == []
    assert steps[1].warnings == ["prepare_step's active_tools named tools the agent does not show: sc_write"]
    assert state.model == "function"


def test_prepare_step_is_told_the_step_the_usage_and_the_last_calls(rt, prefix):
    turn_id = _start(rt, "sc.prepared", prefix)
    state = drive(rt, turn_id)
    plans = PLANS[turn_id]
    tokens = [s.usage.total_tokens for s in state.trace.steps]
    assert plans == [
        (0, 0, []),
        (1, tokens[0], ["sc_lookup"]),
        (2, tokens[0] + tokens[1], ["sc_charge", "sc_lookup"]),
    ]


def test_a_call_to_a_tool_not_shown_on_this_step_is_refused_and_not_run(rt, prefix):
    state = drive(rt, _start(rt, "sc.prepared", prefix))
    results = tool_results(state)
    assert results["call_1_0"].status == ToolResultStatus.OK  # sc_charge, shown on step 1
    refused = results["call_1_1"]
    assert refused.status == ToolResultStatus.NOT_FOUND and refused.is_error
    assert refused.output == {"error": "Tool not available on this step: sc_lookup"}


def test_the_plan_is_made_once_per_step_and_a_retry_keeps_it(rt, prefix):
    turn_id = _start(rt, "sc.retried", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.trace.steps[0].retries == 1
    assert PREPARED_STEPS[turn_id] == [0, 1]  # step 0 was delivered twice, planned once
    assert [s.model for s in state.trace.steps] == ["switched", "scripted"]
    assert [(s.provider) for s in state.trace.steps] == ["scripted", "scripted"]


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ("sc.bad_prepare", "prepare_step of agent sc.bad_prepare raised ValueError: no plan for step 0"),
        (
            "sc.bad_return",
            "prepare_step of agent sc.bad_return returned bad overrides: Extra inputs are not permitted at seed",
        ),
    ],
)
def test_a_failing_prepare_step_fails_the_turn_naming_it(rt, prefix, agent, error):
    state = drive(rt, _start(rt, agent, prefix))
    assert state.status == TurnStatus.FAILED
    assert state.finish_reason == FinishReason.ERROR
    assert state.error == error
    assert state.trace.steps == []  # no model call


# --------------------------------------------------------------------------- static and per-call


def test_static_active_tools_and_tool_choice(rt, prefix):
    state = drive(rt, _start(rt, "sc.static", prefix))
    assert state.status == TurnStatus.COMPLETED, state.error
    asked = _asked(prefix, "sc.static")
    assert [(a["tools"], a["choice"]) for a in asked] == [(["sc_charge"], "required")] * 3
    assert [s.tools for s in state.trace.steps] == [["sc_charge"]] * 3


def test_a_caller_narrows_tools_and_tightens_the_choice(rt, prefix):
    state = drive(rt, _start(rt, "sc.choices", prefix, loop={"active_tools": ["sc_charge"], "tool_choice": "required"}))
    assert state.status == TurnStatus.COMPLETED, state.error
    assert [(a["tools"], a["choice"]) for a in _asked(prefix, "sc.choices")] == [(["sc_charge"], "required")] * 3
    assert (state.limits.active_tools, state.limits.tool_choice) == (["sc_charge"], "required")

    # a tighter choice than the agent's static `required`: one tool by name
    state = drive(rt, _start(rt, "sc.static", prefix + "x", loop={"tool_choice": "sc_charge"}))
    assert [s.tool_choice for s in state.trace.steps] == ["sc_charge"] * 3


def test_the_callers_choice_holds_over_prepare_step(rt, prefix):
    turn_id = _start(rt, "sc.prepared", prefix, loop={"tool_choice": "required"})
    state = drive(rt, turn_id, max_deliveries=10)
    steps = state.trace.steps
    assert steps[0].tool_choice == "sc_lookup"  # prepare_step's named tool is tighter than required: kept
    assert steps[2].tool_choice == "required"  # its `none` is not within `required`: the caller's holds
    assert steps[2].warnings == ["tool_choice 'none' ignored: the turn's overrides set 'required'"]


@pytest.mark.parametrize(
    ("agent", "loop", "message"),
    [
        (
            "sc.choices",
            {"active_tools": ["sc_write"]},
            "active_tools names 'sc_write', which agent sc.choices does not show",
        ),
        ("sc.choices", {"active_tools": ["sc_nope"]}, "active_tools names 'sc_nope'"),
        (
            "sc.static",
            {"active_tools": ["sc_lookup"]},
            "active_tools names 'sc_lookup', which agent sc.static does not show (it shows: sc_charge)",
        ),
        ("sc.static", {"tool_choice": "auto"}, "tool_choice='auto' is looser than agent sc.static's 'required'"),
        ("sc.static", {"tool_choice": "none"}, "tool_choice='none' is looser than agent sc.static's 'required'"),
        (
            "sc.choices",
            {"tool_choice": "sc_write"},
            "tool_choice 'sc_write' is neither auto, none, required nor one of the tools shown",
        ),
        (
            "sc.choices",
            {"active_tools": ["sc_charge"], "tool_choice": "sc_lookup"},
            "tool_choice 'sc_lookup' is neither",
        ),
    ],
)
def test_overrides_that_widen_are_refused_and_nothing_is_stored(rt, prefix, agent, loop, message):
    with pytest.raises(OverrideError, match=re.escape(message)):
        start(rt, agent, prefix, loop=loop)
    assert stored_keys(prefix) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"active_tools": ["sc_nope"]}, "active_tools names 'sc_nope', which allowed_tools does not list"),
        ({"active_tools": ["sc_write"]}, "active_tools names 'sc_write', a write tool the agent hides"),
        ({"active_tools": ["sc_lookup"], "tool_choice": "sc_charge"}, "tool_choice 'sc_charge' is neither"),
    ],
)
def test_definitions_naming_tools_they_cannot_show_are_refused_at_load(fields, message):
    agent = AgentDefinition(
        id="sc.bad_static", allowed_tools=["sc_lookup", "sc_charge", "sc_write"], script=[], **fields
    )
    with pytest.raises(DefinitionError, match=re.escape(message)):
        AgentRegistry().register(agent)


# --------------------------------------------------------------------------- tool_choice on each provider's wire


def _run_to_end(rt: Any, turn_id: str) -> Any:
    """Deliver the turn's current step until the turn ends. On a loaded machine a delivery can lose its
    lease (the heartbeat starved): the step is then delivered again, as the sweeper would."""
    found: dict[str, Any] = {}

    def ended() -> bool:
        state = rt.turns.load(turn_id)
        if state.status.terminal:
            found["state"] = state
            return True
        StepRunner(rt).deliver(turn_id, state.step)
        return False

    eventually(ended, timeout=120, what=f"turn {turn_id} to end")
    return found["state"]


def _wire_turn(rt: Any, prefix: str, agent: str, choices: list[str] | None = None) -> Any:
    metadata: dict[str, Any] = {"prefix": prefix}
    if choices is not None:
        metadata["choices"] = choices
    state, _ = create_turn(rt, agent, prompt="look a up", metadata=metadata)
    done = _run_to_end(rt, state.turn_id)
    assert done.status == TurnStatus.COMPLETED, done.error
    assert done.text == "done"
    assert [s.tool_choice for s in done.trace.steps] == (choices or ["auto", "required", "sc_lookup", "none"])
    return done


def test_anthropic_tool_choice_on_the_wire(rt, prefix, anthropic_fake):  # noqa: F811
    anthropic_fake.enqueue(
        *[
            anth.stream(anth.tool_use_block(0, f"toolu_{i}", "sc_lookup", ['{"key": "a"}']), stop_reason="tool_use")
            for i in range(3)
        ],
        anth.text_reply("done"),
    )
    _wire_turn(rt, prefix, "sc.wire_anthropic")
    bodies = anthropic_fake.bodies()
    assert [b["tool_choice"] for b in bodies] == [
        {"type": "auto"},
        {"type": "any"},
        {"type": "tool", "name": "sc_lookup"},
        {"type": "none"},
    ]
    assert [[t["name"] for t in b["tools"]] for b in bodies] == [
        ["sc_lookup", "sc_charge"],
        ["sc_lookup"],  # active_tools on step 1
        ["sc_lookup", "sc_charge"],
        ["sc_lookup", "sc_charge"],
    ]


def test_gemini_tool_choice_on_the_wire(rt, prefix, gemini_fake):  # noqa: F811
    gemini_fake.enqueue(
        *[gem.parts_reply(gem.function_call("sc_lookup", {"key": "a"})) for _ in range(3)],
        gem.text_reply("done"),
    )
    _wire_turn(rt, prefix, "sc.wire_gemini")
    bodies = gemini_fake.bodies()
    assert [b["toolConfig"]["functionCallingConfig"] for b in bodies] == [
        {"mode": "AUTO"},
        {"mode": "ANY"},
        {"mode": "ANY", "allowedFunctionNames": ["sc_lookup"]},
        {"mode": "NONE"},
    ]
    declared = [[d["name"] for d in b["tools"][0]["functionDeclarations"]] for b in bodies]
    assert declared[1] == ["sc_lookup"] and declared[0] == ["sc_lookup", "sc_charge"]


def test_bedrock_tool_choice_on_the_wire(rt, prefix, bedrock_fake):  # noqa: F811
    bedrock_fake.add(
        *[bed.turn(bed.tool_block(0, f"tu_{i}", "sc_lookup", {"key": "a"}), stop="tool_use") for i in range(3)],
        bed.turn(bed.text_block(0, ["done"])),
    )
    _wire_turn(rt, prefix, "sc.wire_bedrock")
    configs = [r.body["toolConfig"] for r in bedrock_fake.requests]
    assert [c.get("toolChoice") for c in configs] == [
        {"auto": {}},
        {"any": {}},
        {"tool": {"name": "sc_lookup"}},
        None,  # no "none" on Bedrock; the transcript's tool calls need the tools declared, so they stay, unforced
    ]
    assert [t["toolSpec"]["name"] for t in configs[1]["tools"]] == ["sc_lookup"]


def test_bedrock_none_before_any_tool_use_leaves_the_tools_out(rt, prefix, bedrock_fake):  # noqa: F811
    bedrock_fake.add(bed.turn(bed.text_block(0, ["done"])))
    _wire_turn(rt, prefix, "sc.wire_bedrock", choices=["none"])
    [request] = bedrock_fake.requests
    assert "toolConfig" not in request.body


def test_openai_responses_tool_choice_on_the_wire(rt, prefix, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        *[oai.response_stream(oai.call_item(f"call_{i}", "sc_lookup", ['{"key": "a"}'])) for i in range(3)],
        oai.response_text("done"),
    )
    _wire_turn(rt, prefix, "sc.wire_openai")
    bodies = openai_fake.bodies()
    assert [b["tool_choice"] for b in bodies] == ["auto", "required", {"type": "function", "name": "sc_lookup"}, "none"]
    assert [t["name"] for t in bodies[1]["tools"]] == ["sc_lookup"]


def test_openai_chat_completions_tool_choice_on_the_wire(rt, prefix, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        *[
            oai.chat_stream(oai.chat_tool_call(f"call_{i}", "sc_lookup", ['{"key": "a"}']), finish="tool_calls")
            for i in range(3)
        ],
        oai.chat_text("done"),
    )
    _wire_turn(rt, prefix, "sc.wire_openai_compatible")
    bodies = openai_fake.bodies()
    assert [b["tool_choice"] for b in bodies] == [
        "auto",
        "required",
        {"type": "function", "function": {"name": "sc_lookup"}},
        "none",
    ]
    assert [t["function"]["name"] for t in bodies[1]["tools"]] == ["sc_lookup"]
