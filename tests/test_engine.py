"""The step engine in-process against real Redis: loop limits and overrides, object mode with repair,
tool dispatch errors, the failure-strike breaker, usage and trace, stored tool results, truncation."""

from __future__ import annotations

import pytest

from stepq.errors import OverrideError
from stepq.fleet.runtime import get_runtime
from stepq.models import (
    AssistantMessage,
    EventType,
    FinishReason,
    ToolResult,
    ToolResultMessage,
    TurnResult,
    TurnStatus,
    Usage,
    UserMessage,
)
from tests.agents_engine import drive, executions, gate_key, start, stored_keys, tool_results
from tests.conftest import make_settings


def _assistant_steps(state) -> list[AssistantMessage]:
    return [m for m in state.messages if isinstance(m, AssistantMessage)]


# --------------------------------------------------------------------------- loop: max_steps, stop_when, budgets


def test_max_steps_ends_with_max_steps(rt, prefix):
    turn_id = start(rt, "eng.loop", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.finish_reason == FinishReason.MAX_STEPS
    assert len(state.trace.steps) == 4
    assert executions(prefix, turn_id, "eng_count") == 4  # the capped step's tools still ran


def test_stop_when_step_count(rt, prefix):
    turn_id = start(rt, "eng.stop_steps", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.finish_reason == FinishReason.STEP_COUNT
    assert len(state.trace.steps) == 2
    assert executions(prefix, turn_id, "eng_count") == 2


def test_stop_when_has_tool_call(rt, prefix):
    turn_id = start(rt, "eng.stop_tool", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.finish_reason == FinishReason.HAS_TOOL_CALL
    assert [s.tool_calls for s in state.trace.steps] == [["eng_count"], ["eng_count"], ["eng_echo"]]
    assert tool_results(state)["call_2_0"].output == {"echo": "stop here"}  # the stopping call still ran


def test_budget_max_tool_calls(rt, prefix):
    turn_id = start(rt, "eng.budget_tools", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.finish_reason == FinishReason.BUDGET
    assert executions(prefix, turn_id, "eng_count") == 2
    assert state.tool_calls_made == 2


def test_budget_max_tokens(rt, prefix):
    turn_id = start(rt, "eng.budget_tokens", prefix)
    state = drive(rt, turn_id)
    assert state.finish_reason == FinishReason.BUDGET
    assert len(state.trace.steps) == 2  # 20 tokens after step 0 (< 30), 40 after step 1
    assert state.usage.total_tokens == 40


def test_budget_max_wall_clock(rt, prefix):
    """The clock is moved, not waited for: the turn's start is set 100 s into the past between steps."""
    turn_id = start(rt, "eng.budget_clock", prefix)
    from stepq.engine.runner import StepRunner

    decision = StepRunner(rt).deliver(turn_id, 0)
    assert decision.action == "next"
    state = rt.turns.load(turn_id)
    assert state.started_at is not None
    state.started_at -= 100
    assert rt.turns.commit(state)

    assert StepRunner(rt).deliver(turn_id, 1).action == "none"
    state = rt.turns.load(turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.finish_reason == FinishReason.BUDGET
    assert len(state.trace.steps) == 1  # no model call after the budget ran out
    assert executions(prefix, turn_id, "eng_count") == 1


def test_override_tightens_max_steps(rt, prefix):
    turn_id = start(rt, "eng.loop", prefix, loop={"max_steps": 2})
    state = drive(rt, turn_id)
    assert state.limits.max_steps == 2
    assert state.finish_reason == FinishReason.MAX_STEPS
    assert len(state.trace.steps) == 2


def test_override_tightens_budget_and_adds_stop_conditions(rt, prefix):
    turn_id = start(rt, "eng.loop", prefix, loop={"budget": {"max_tool_calls": 1}})
    state = drive(rt, turn_id)
    assert state.finish_reason == FinishReason.BUDGET
    assert executions(prefix, turn_id, "eng_count") == 1

    turn_id = start(rt, "eng.loop", prefix, loop={"budget": {"max_tokens": 15}})
    state = drive(rt, turn_id)
    assert state.finish_reason == FinishReason.BUDGET and len(state.trace.steps) == 1

    turn_id = start(rt, "eng.loop", prefix, loop={"stop_when": [{"has_tool_call": "eng_count"}]})
    state = drive(rt, turn_id)
    assert state.finish_reason == FinishReason.HAS_TOOL_CALL and len(state.trace.steps) == 1

    turn_id = start(rt, "eng.loop", prefix, loop={"stop_when": [{"step_count": 3}]})
    state = drive(rt, turn_id)
    assert state.finish_reason == FinishReason.STEP_COUNT and len(state.trace.steps) == 3


@pytest.mark.parametrize(
    ("loop", "named"),
    [
        ({"max_steps": 5}, "max_steps"),
        ({"budget": {"max_tool_calls": 11}}, "max_tool_calls"),
        ({"budget": {"max_tokens": 20_000}}, "max_tokens"),
        ({"budget": {"max_wall_clock_s": 601}}, "max_wall_clock_s"),
    ],
)
def test_override_that_widens_is_refused_and_nothing_is_stored(rt, prefix, loop, named):
    with pytest.raises(OverrideError, match=named) as info:
        start(rt, "eng.loop", prefix, loop=loop)
    assert "only tighten" in str(info.value)
    assert stored_keys(prefix) == []


def test_override_may_not_set_a_budget_the_agent_does_not_allow_to_widen(rt, prefix):
    """A budget on an agent with none is a tightening; an unknown override field is refused."""
    turn_id = start(rt, "eng.stop_steps", prefix, loop={"budget": {"max_tool_calls": 1}})
    assert drive(rt, turn_id).finish_reason == FinishReason.BUDGET
    with pytest.raises(OverrideError, match="max_stepz"):
        start(rt, "eng.loop", prefix, loop={"max_stepz": 1})


# --------------------------------------------------------------------------- object mode


@pytest.mark.parametrize("kind", ["model", "schema"])
def test_object_mode_valid_answer(rt, prefix, kind):
    state = drive(rt, start(rt, f"eng.object_{kind}_ok", prefix))
    assert state.status == TurnStatus.COMPLETED
    assert state.result().object == {"name": "Ada", "age": 36}
    assert len(state.trace.steps) == 1


@pytest.mark.parametrize("kind", ["model", "schema"])
def test_object_mode_one_repair_step(rt, prefix, kind):
    turn_id = start(rt, f"eng.object_{kind}_repair", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.object == {"name": "Ada", "age": 36}
    assert len(state.trace.steps) == 2
    assert state.repairs_used == 1
    notes = [m.content for m in state.messages if isinstance(m, UserMessage)][1:]
    assert len(notes) == 1
    assert "age" in notes[0]  # the repair note names what was wrong
    assert ("Field required" if kind == "model" else "'age' is a required property") in notes[0]
    finish = [e for e in rt.events.read(turn_id) if e.type == EventType.TURN_FINISH][-1]
    assert finish.data["object"] == {"name": "Ada", "age": 36}


@pytest.mark.parametrize("kind", ["model", "schema"])
def test_object_mode_invalid_twice_fails_naming_the_errors(rt, prefix, kind):
    turn_id = start(rt, f"eng.object_{kind}_bad", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.FAILED
    assert state.finish_reason == FinishReason.ERROR
    assert len(state.trace.steps) == 2
    assert state.error is not None
    assert "output schema" in state.error and "age" in state.error
    assert ("greater than or equal to 0" if kind == "model" else "minimum of 0") in state.error
    assert state.object is None
    errors = [e for e in rt.events.read(turn_id) if e.type == EventType.ERROR]
    assert errors and "age" in errors[0].data["message"]


def test_object_mode_without_steps_left_fails_instead_of_repairing(rt, prefix):
    state = drive(rt, start(rt, "eng.object_model_repair", prefix, loop={"max_steps": 1}))
    assert state.status == TurnStatus.FAILED
    assert len(state.trace.steps) == 1 and state.repairs_used == 0
    assert state.error is not None and "age" in state.error


def test_object_mode_that_never_answers_fails_at_the_cap(rt, prefix):
    state = drive(rt, start(rt, "eng.object_capped", prefix))
    assert state.status == TurnStatus.FAILED
    assert len(state.trace.steps) == 2
    assert state.error is not None and "no valid object" in state.error


def test_object_mode_non_json_answer_is_repaired(rt, prefix):
    state = drive(rt, start(rt, "eng.object_not_json", prefix))
    assert state.status == TurnStatus.COMPLETED
    assert state.object == {"name": "Ada", "age": 36}
    notes = [m.content for m in state.messages if isinstance(m, UserMessage)][1:]
    assert "not valid JSON" in notes[0]


# --------------------------------------------------------------------------- tool dispatch


def test_invalid_args_become_error_results_and_the_tool_does_not_run(rt, prefix):
    turn_id = start(rt, "eng.bad_args", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    results = tool_results(state)
    for call_id, needle in [("missing", "label"), ("extra", "surprise"), ("wrong_type", "label")]:
        assert results[call_id].is_error
        assert results[call_id].output["status"] == "invalid_arguments"
        assert needle in results[call_id].output["error"]
    assert not results["good"].is_error
    assert executions(prefix, turn_id, "eng_count") == 1  # only the valid call ran
    # the model's next step saw the errors: they come right before its second answer in the transcript
    kinds = [type(m).__name__ for m in state.messages]
    assert kinds == ["UserMessage", "AssistantMessage", "ToolResultMessage", "AssistantMessage"]
    events = [e for e in rt.events.read(turn_id) if e.type == EventType.TOOL_RESULT]
    assert {e.data["id"]: e.data["is_error"] for e in events} == {
        "missing": True,
        "extra": True,
        "wrong_type": True,
        "good": False,
    }


def test_unknown_tool_without_breaker(rt, prefix):
    state = drive(rt, start(rt, "eng.unknown_tool", prefix))
    assert state.status == TurnStatus.COMPLETED and state.text == "done"
    result = tool_results(state)["u"]
    assert result.is_error
    assert result.output == {"error": "Tool not found: eng_nonexistent"}


def test_unknown_tool_with_breaker_never_escalates(rt, prefix):
    state = drive(rt, start(rt, "eng.unknown_tool_breaker", prefix))
    assert state.status == TurnStatus.COMPLETED
    outputs = [r.output for r in tool_results(state).values()]
    expected = {
        "error": 'TOOL_NOT_FOUND: "eng_nonexistent" does not exist.',
        "status": "permanently_failed",
        "do_not_retry": True,
    }
    assert outputs == [expected, expected, expected]
    assert "eng_nonexistent" not in state.failed_tools  # not found is not a strike


def test_raising_tool_becomes_an_error_result_and_the_turn_goes_on(rt, prefix):
    turn_id = start(rt, "eng.raising", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.text == "recovered"
    result = tool_results(state)["b"]
    assert result.is_error and result.output == {"error": "RuntimeError: boom: x", "status": "failed"}
    assert executions(prefix, turn_id, "eng_boom") == 1


def test_tool_timeout_becomes_an_error_result(rt, prefix):
    turn_id = start(rt, "eng.stuck", prefix)
    try:
        state = drive(rt, turn_id)
    finally:
        rt.redis.rpush(gate_key(prefix, "t"), "open")  # free the tool's thread
    assert state.status == TurnStatus.COMPLETED and state.text == "went on"
    result = tool_results(state)["s"]
    assert result.is_error
    assert result.output == {"error": "tool eng_stuck timed out after 0.2s", "status": "failed"}


def test_tool_context_carries_turn_call_key_and_metadata(rt, prefix):
    turn_id = start(rt, "eng.context", prefix)
    output = tool_results(drive(rt, turn_id))["ctx1"].output
    assert output["turn_id"] == turn_id
    assert output["tool_call_id"] == "ctx1"
    assert output["idempotency_key"] == f"{turn_id}:ctx1"
    assert output["metadata"] == {"prefix": prefix}
    assert output["logger"].endswith("eng_context")


def test_breaker_fail_fail_then_permanently_failed(rt, prefix):
    turn_id = start(rt, "eng.breaker", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert executions(prefix, turn_id, "eng_boom") == 2
    outputs = [r.output for r in tool_results(state).values()]
    failed = {"error": "RuntimeError: boom: x", "status": "failed"}
    blocked = {
        "error": 'TOOL_PERMANENTLY_FAILED: "eng_boom" has failed 2 times. Last error: RuntimeError: boom: x.',
        "status": "permanently_failed",
        "do_not_retry": True,
    }
    assert outputs == [failed, failed, blocked, blocked]


def test_breaker_counts_strikes_within_one_step(rt, prefix):
    """Tool calls of a step run one after another: the third call of a step is gated by the first two's strikes."""
    turn_id = start(rt, "eng.breaker_one_step", prefix)
    state = drive(rt, turn_id)
    assert executions(prefix, turn_id, "eng_boom") == 2
    results = tool_results(state)
    assert results["b0"].output == {"error": "RuntimeError: boom: 0", "status": "failed"}
    assert results["b1"].output == {"error": "RuntimeError: boom: 1", "status": "failed"}
    assert (
        results["b2"].output["error"]
        == 'TOOL_PERMANENTLY_FAILED: "eng_boom" has failed 2 times. Last error: RuntimeError: boom: 1.'
    )
    assert results["b2"].output["status"] == "permanently_failed"


def test_without_breaker_every_call_executes(rt, prefix):
    turn_id = start(rt, "eng.no_breaker", prefix)
    state = drive(rt, turn_id)
    assert executions(prefix, turn_id, "eng_boom") == 4
    assert all(r.output == {"error": "RuntimeError: boom: x", "status": "failed"} for r in tool_results(state).values())
    assert state.failed_tools == {}


# --------------------------------------------------------------------------- usage and trace


def test_usage_is_summed_and_the_trace_is_stored_with_the_result(rt, prefix):
    turn_id = start(rt, "eng.usage_trace", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    result = TurnResult.model_validate_json(state.result().model_dump_json())  # what a caller gets back

    steps = result.trace.steps
    assert [s.step for s in steps] == [0, 1, 2]
    assert [(s.usage.input_tokens, s.usage.output_tokens) for s in steps] == [(11, 7), (13, 5), (17, 3)]
    total = Usage()
    for s in steps:
        total = total + s.usage
    assert result.usage == total
    assert (result.usage.input_tokens, result.usage.output_tokens) == (41, 15)

    assert all(s.provider == "scripted" and s.model == "scripted" for s in steps)
    assert [s.tool_calls for s in steps] == [["eng_echo"], ["eng_echo"], []]
    assert [s.retries for s in steps] == [1, 0, 0]  # step 0 hit one 429 first
    assert [s.stop_reason for s in steps] == ["tool-calls", "tool-calls", "stop"]
    assert [s.raw_stop_reason for s in steps] == ["tool_use", "tool_use", "end_turn"]
    assert all(s.duration_s >= 0 for s in steps)
    assert steps[2].duration_s > 0  # its deltas each came after a simulated model delay

    step_finish = [e for e in rt.events.read(turn_id) if e.type == EventType.STEP_FINISH]
    assert [Usage.model_validate(e.data["usage"]) for e in step_finish] == [s.usage for s in steps]
    retries = [e for e in rt.events.read(turn_id) if e.type == EventType.STEP_RETRY]
    assert len(retries) == 1 and retries[0].data["status"] == 429


# --------------------------------------------------------------------------- stored tool results


def test_stored_tool_result_is_reused_not_re_executed(rt, prefix):
    """A re-run step finds the result stored under (turn_id, tool_call_id) and does not run the tool again.

    The crash left what a real crash leaves: the model's checkpointed answer (saved before any tool
    runs) and the result of the tool that had already run."""
    from stepq.models import AssistantMessage, StepOutput, ToolCall

    turn_id = start(rt, "eng.rerun", prefix)
    answer = AssistantMessage(parts=[ToolCall(id="call_fixed", name="eng_count", args={"label": "once"})])
    rt.turns.save_checkpoint(turn_id, 0, StepOutput(message=answer).model_dump_json())
    earlier = ToolResult(tool_call_id="call_fixed", name="eng_count", output={"label": "once", "count": 1})
    rt.tool_results.put(turn_id, earlier)

    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert executions(prefix, turn_id, "eng_count") == 0
    assert tool_results(state)["call_fixed"] == earlier
    event = next(e for e in rt.events.read(turn_id) if e.type == EventType.TOOL_RESULT)
    assert event.data["output"] == earlier.output


def test_tool_result_is_stored_by_turn_and_call_id(rt, prefix):
    turn_id = start(rt, "eng.rerun", prefix)
    state = drive(rt, turn_id)
    assert executions(prefix, turn_id, "eng_count") == 1
    stored = rt.tool_results.get_many(turn_id, ["call_fixed"])
    assert stored["call_fixed"] == tool_results(state)["call_fixed"]
    # storing again never overwrites: first stored wins
    again = rt.tool_results.put(turn_id, ToolResult(tool_call_id="call_fixed", name="eng_count", output="other"))
    assert again == stored["call_fixed"]


def test_a_fast_read_only_step_writes_no_checkpoint(prefix):
    """The commit comes first: the checkpoint of a step whose tools are read-only is dropped unwritten.

    It would ride the next timed flush, so the flush window is made longer than any step can take on a
    loaded machine: what is checked is the order (commit before the flush), not how fast the step ran."""
    rt = get_runtime(make_settings(prefix, coalesce_window_ms=600_000))
    turn_id = start(rt, "eng.simple", prefix)
    assert drive(rt, turn_id).status == TurnStatus.COMPLETED
    assert not rt.redis.exists(rt.keys.checkpoint(turn_id))


def test_a_slow_read_only_tool_finds_its_step_checkpointed(rt, prefix):
    """The checkpoint rides the flush window: a read-only tool slower than it finds the model's answer stored,
    so a crash from then on replays the answer instead of asking the model again."""
    turn_id = start(rt, "eng.slow_read", prefix)
    state = drive(rt, turn_id)
    assert tool_results(state)["w"].output == {"checkpoint": True}


def test_oversized_tool_result_is_truncated_with_a_marker(rt, prefix):
    turn_id = start(rt, "eng.big_result", prefix)
    state = drive(rt, turn_id)
    limit = rt.settings.max_tool_result_chars
    output = tool_results(state)["big"].output
    assert isinstance(output, str)
    assert "truncated" in output
    assert len(output) < limit + 100
    assert output.startswith('"' + "y" * 100)
    transcript = [m for m in state.messages if isinstance(m, ToolResultMessage)]
    assert transcript[0].results[0].output == output  # what the model saw next
    event = next(e for e in rt.events.read(turn_id) if e.type == EventType.TOOL_RESULT)
    assert event.data["output"] == output


def test_small_tool_result_is_not_truncated(rt, prefix):
    state = drive(rt, start(rt, "eng.simple", prefix))
    assert tool_results(state)["call_0_0"].output == {"echo": "x"}
    assert _assistant_steps(state)[-1].text == "all done"
