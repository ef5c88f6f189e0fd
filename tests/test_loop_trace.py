"""The loop trace is complete: each step records its tool calls' sizes and outcomes, malformed and repair marks,
the stop by kind, its cost and what it used; a parked step's trace is written when it resumes, with the
approved call's result; `turn-finish` carries the trace summary. In-process against real Redis."""

from __future__ import annotations

import json

from stepq.engine.decisions import decide_approval
from stepq.engine.runner import StepRunner
from stepq.models import EventType, LoopStop, ToolCallTrace, ToolResultStatus, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive, start, tool_results
from tests.fakes import gemini_server as gem
from tests.test_step_control import _run_to_end
from tests.test_structured_output import gemini_fake  # noqa: F401 - a fixture


def _chars(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False))


def test_each_call_records_its_argument_and_result_sizes_and_status(rt, prefix):
    state = drive(rt, start(rt, "sc.prepared", prefix, prompt=f"sizes {prefix}"))
    first, second, _ = state.trace.steps
    [looked_up] = first.calls
    assert looked_up.started_at is not None and looked_up.duration_s is not None  # it ran: when, and how long
    assert looked_up.model_copy(update={"started_at": None, "duration_s": None}) == (
        ToolCallTrace(
            id="call_0_0",
            name="sc_lookup",
            input_chars=_chars({"key": "a"}),
            output_chars=_chars({"key": "a", "value": "A"}),
            status=ToolResultStatus.OK,
        )
    )
    charge, refused = second.calls
    assert (charge.name, charge.status, charge.output_chars) == (
        "sc_charge",
        "ok",
        _chars({"charged": 5, "paid": False}),
    )
    assert (refused.name, refused.status) == ("sc_lookup", ToolResultStatus.NOT_FOUND)
    assert refused.output_chars == _chars({"error": "Tool not available on this step: sc_lookup"})
    assert charge.duration_s is not None and refused.duration_s is None  # refused: its function never ran


def test_invalid_arguments_and_truncation_are_marked(rt, prefix):
    state = drive(rt, start(rt, "eng.schemas", prefix))
    by_id = {c.id: c for c in state.trace.steps[0].calls}
    assert by_id["s_ok"].status == ToolResultStatus.OK
    assert by_id["s_bad"].status == ToolResultStatus.INVALID_ARGUMENTS

    state = drive(rt, start(rt, "eng.big_result", prefix))
    [big] = state.trace.steps[0].calls
    assert big.truncated and big.output_chars == _chars(tool_results(state)["big"].output)
    assert big.output_chars < 50_000


def test_repair_marks(rt, prefix):
    state = drive(rt, start(rt, "eng.object_model_repair", prefix))
    assert state.status == TurnStatus.COMPLETED
    first, second = state.trace.steps
    assert (first.invalid_output, first.repair) == (True, False)
    assert (second.invalid_output, second.repair) == (False, True)


def test_malformed_mark(rt, prefix, gemini_fake):  # noqa: F811
    gemini_fake.enqueue(gem.parts_reply(finish="MALFORMED_FUNCTION_CALL"), gem.text_reply("recovered"))
    state = _run_to_end(rt, start(rt, "gemini_t.chat", prefix))
    assert state.text == "recovered"
    assert [s.malformed for s in state.trace.steps] == [True, False]
    assert state.trace.summary()["malformed"] == 1


def test_a_parked_step_is_traced_when_it_resumes_with_the_approved_result(rt, prefix):
    state, _ = create_turn(rt, "eng.predicate", prompt="go", metadata={"prefix": prefix})
    turn_id = state.turn_id
    assert StepRunner(rt).deliver(turn_id, 0).action == "none"
    parked = rt.turns.load(turn_id)
    assert parked.status == TurnStatus.AWAITING_APPROVAL
    assert parked.trace.steps == []  # held with the parked step until it resumes
    [request] = [e for e in rt.events.read(turn_id) if e.type == EventType.APPROVAL_REQUEST]
    token = rt.approvals.get(request.data["approval_id"]).token
    assert decide_approval(rt, request.data["approval_id"], token, True).accepted

    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    first = state.trace.steps[0]
    assert [(c.id, c.status) for c in first.calls] == [("small", "ok"), ("large", "ok")]
    large = tool_results(state)["large"].output
    assert first.calls[1].output_chars == _chars(large)
    assert len(state.trace.steps) == 2 and state.trace.steps[0].step == 0


def test_turn_finish_carries_the_trace_summary(rt, prefix):
    turn_id = start(rt, "sc.paid", prefix)
    state = drive(rt, turn_id)
    [finish] = [e for e in rt.events.read(turn_id) if e.type == EventType.TURN_FINISH]
    summary = finish.data["trace"]
    assert summary == json.loads(json.dumps(state.trace.summary()))
    assert summary["steps"] == 2 and summary["tool_calls"] == 2
    assert summary["models"] == ["scripted/scripted"]
    rows = summary["per_step"]
    assert [r["stopped_by"] for r in rows] == [None, LoopStop.CUSTOM.value]
    assert rows[1]["stop_detail"] == "sc.billing_paid"
    assert rows[0]["tool_input_chars"] == _chars({"amount": 50})
    assert rows[0]["tool_output_chars"] == _chars({"charged": 50, "paid": False})
    assert [r["tokens"] for r in rows] == [10, 10]
    assert [r["stop_reason"] for r in rows] == ["tool-calls", "tool-calls"]
