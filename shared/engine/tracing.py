"""The step trace's details that are known only after the model call: each tool call's sizes and outcome.

A step's trace is written with the step's last commit and never rewritten (the trace is append-only in
Redis), so everything it records is filled in before that commit; a step parked for approvals keeps its
trace with the parked step and writes it when it resumes, with the approved calls' results.
"""

from __future__ import annotations

import json
from typing import Any

from stepq.models import StepTrace, ToolCall, ToolCallTrace, ToolResult, ToolResultMessage, TurnState

TRUNCATED = "…[truncated "  # the marker dispatch appends to a cut result
Timings = dict[str, tuple[float, float]]  # tool call id -> (wall-clock start, seconds it ran)


def this_step(state: TurnState) -> StepTrace | None:
    """The trace of the step now running, if it has one yet."""
    trace = state.trace.steps[-1] if state.trace.steps else None
    return trace if trace is not None and trace.step == state.step else None


def record_calls(state: TurnState, calls: list[ToolCall], timings: Timings | None = None) -> None:
    """Fill the step's trace with each call's argument and result sizes (JSON characters), status and time
    (from this delivery's runs, or kept from before the step parked)."""
    trace = this_step(state)
    if trace is None or not calls:
        return
    last = state.messages[-1] if state.messages else None
    results = {r.tool_call_id: r for r in last.results} if isinstance(last, ToolResultMessage) else {}
    known = {**_kept(trace), **(timings or {})}
    trace.calls = [_call_trace(call, results.get(call.id), known.get(call.id)) for call in calls]


def keep_timings(trace: StepTrace, calls: list[ToolCall], timings: Timings) -> None:
    """A step parks: the calls that already ran keep their times in its trace until it resumes."""
    trace.calls = [_call_trace(call, None, timings[call.id]) for call in calls if call.id in timings]


def _kept(trace: StepTrace) -> Timings:
    return {
        c.id: (c.started_at, c.duration_s) for c in trace.calls if c.started_at is not None and c.duration_s is not None
    }


def _call_trace(call: ToolCall, result: ToolResult | None, timing: tuple[float, float] | None = None) -> ToolCallTrace:
    output = None if result is None else result.output
    return ToolCallTrace(
        started_at=timing[0] if timing else None,
        duration_s=timing[1] if timing else None,
        id=call.id,
        name=call.name,
        input_chars=_chars(call.args),
        output_chars=None if result is None else _chars(output),
        status=None if result is None else result.status,
        truncated=isinstance(output, str) and TRUNCATED in output,
    )


def _chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def resume_trace(state: TurnState, parked: StepTrace) -> None:
    """Put a parked step's trace back in the turn (once: a turn parked by an older worker already has it)."""
    last = state.trace.steps[-1] if state.trace.steps else None
    if last != parked:  # (a compaction call of the same step may precede it)
        state.trace.steps.append(parked)


def new_traces(state: TurnState, before: int) -> list[StepTrace]:
    """The traces a delivery produced (for metrics), the one a parked step holds back included."""
    added = list(state.trace.steps[before:])
    if state.parked is not None:
        added.append(state.parked.step_trace)
    return added
