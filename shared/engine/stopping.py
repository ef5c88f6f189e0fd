"""Stop conditions after a tool step, by kind, the loop's limits, and where the loop records which one fired.

`step_count` and `has_tool_call` are data; `custom` names a predicate registered with
`stop_condition` (stepq.agents.stops) and is asked here with a `StopContext` of the step that just ran.
"""

from __future__ import annotations

import logging
import time

from stepq.agents.definition import AgentDefinition
from stepq.agents.stops import StopContext, get_stop_condition, unknown_message
from stepq.errors import StepqError
from stepq.models import LoopStop, ToolCall, ToolResultMessage, TurnState

log = logging.getLogger("stepq.engine")


class StopConditionError(StepqError):
    """A custom stop condition is not registered on this worker, or it raised: the turn fails, naming it."""


def condition_stop(state: TurnState, calls: list[ToolCall]) -> tuple[LoopStop, str] | None:
    """The stop condition a finished tool step met (has_tool_call, then custom, then step_count), with
    what it named (the tool, the condition, the count); None when none did."""
    limits = state.limits
    called = next((c.name for c in calls if c.name in limits.stop_on_tool), None)
    if called is not None:
        return LoopStop.HAS_TOOL_CALL, called
    custom = custom_stop(state, calls)
    if custom is not None:
        return LoopStop.CUSTOM, custom
    if limits.stop_after_steps is not None and state.step + 1 >= limits.stop_after_steps:
        return LoopStop.STEP_COUNT, str(limits.stop_after_steps)
    return None


def loop_stop(state: TurnState, agent: AgentDefinition, calls: list[ToolCall]) -> LoopStop | None:
    """The first loop limit a finished tool step reached, if any."""
    limits = state.limits
    done = state.step + 1
    condition = condition_stop(state, calls)
    if condition is not None:
        stop, state.stop_detail = condition
        return stop
    if done >= limits.max_steps:
        return LoopStop.MAX_STEPS
    if limits.max_tokens is not None and state.usage.total_tokens + answer_reserve(state, agent) >= (limits.max_tokens):
        return LoopStop.TOKEN_BUDGET
    if over_wall_clock(state):
        return LoopStop.WALL_CLOCK_BUDGET
    return None


def answer_reserve(state: TurnState, agent: AgentDefinition) -> int:
    """Object mode holds back tokens for its answer step: the budget's reserve, else the last step's tokens."""
    if agent.execution_mode != "object" or state.object is not None or state.answer_due is not None:
        return 0
    if state.limits.answer_reserve_tokens is not None:
        return state.limits.answer_reserve_tokens
    return state.trace.steps[-1].usage.total_tokens if state.trace.steps else 0


def reserve_answer(state: TurnState, agent: AgentDefinition, stop: LoopStop) -> bool:
    """Object mode without an object: a limit spends one reserved answer step (tools off, schema forced)
    instead of ending the turn. False when that step was already spent or no step is left."""
    if agent.execution_mode != "object" or state.object is not None or state.answer_due is not None:
        return False
    if not steps_left(state):
        return False
    state.answer_due = stop
    mark(state, stop)
    return True


def answers_anyway(state: TurnState, agent: AgentDefinition, stop: LoopStop) -> bool:
    """A limit found before the model call (wall clock): object mode makes this step the answer step;
    the answer step (or its repair) itself always runs."""
    if agent.execution_mode != "object" or state.object is not None:
        return False
    if state.answer_due is None:
        state.answer_due = stop
    return True


def steps_left(state: TurnState) -> bool:
    """Another step fits under max_steps after this one."""
    return state.step + 1 < state.limits.max_steps


def over_wall_clock(state: TurnState) -> bool:
    """The turn has run longer than its wall-clock budget."""
    limit = state.limits.max_wall_clock_s
    return bool(limit and state.started_at and time.time() - state.started_at > limit)


def custom_stop(state: TurnState, calls: list[ToolCall]) -> str | None:
    """The name of the first registered stop condition that answers True for this step, in the order given."""
    if not state.limits.stop_custom:
        return None
    last = state.messages[-1] if state.messages else None
    results = last.results if isinstance(last, ToolResultMessage) else []
    context = StopContext(
        turn_id=state.turn_id,
        agent=state.agent,
        step=state.step,
        usage=state.usage,
        cost=state.cost,
        tool_calls=list(calls),
        results=list(results),
        tool_calls_made=state.tool_calls_made,
        messages=list(state.messages),
        metadata=dict(state.metadata),
    )
    for name in state.limits.stop_custom:
        predicate = get_stop_condition(name)
        if predicate is None:
            raise StopConditionError(f"stop condition {name!r}: {unknown_message(name)}")
        try:
            stop = predicate(context)
        except Exception as exc:
            log.exception("stop condition %s raised", name)
            raise StopConditionError(f"stop condition {name!r} raised {type(exc).__name__}: {exc}") from exc
        if stop:
            return name
    return None


def mark(state: TurnState, stop: LoopStop) -> None:
    """Record on the turn and on this step's trace which limit ended the tool steps."""
    state.stop_detail = state.stop_detail if stop in _CONDITIONS else None
    trace = state.trace.steps[-1] if state.trace.steps else None
    if trace is not None and trace.step == state.step and trace.stopped_by is None:
        trace.stopped_by = stop
        trace.stop_detail = state.stop_detail


_CONDITIONS = frozenset({LoopStop.STEP_COUNT, LoopStop.HAS_TOOL_CALL, LoopStop.CUSTOM})
