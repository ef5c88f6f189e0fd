"""The stage that runs the tool calls of a model's answer, or parks the step on the calls that wait.

The calls go through the step's dispatcher (engine/dispatch.py): validated, gated, executed once, each
result stored by tool-call id. Before a tool with side effects runs, the answer that asked for it is
durable (the step's checkpoint), so a re-run replays the same calls and reuses their stored results.
Calls that wait (for a person's approval, or a client-side tool's result) park the step
(engine/park.py); the rest run now. The tool-call budget is checked before anything runs.
"""

from __future__ import annotations

from stepq.agents import task_plan
from stepq.engine import stopping, tracing
from stepq.engine.begin import ModelCall
from stepq.engine.context import Decision, StepContext
from stepq.engine.deadline import step_deadline
from stepq.engine.decide import after_tools
from stepq.engine.dispatch import StepDispatcher, runnable
from stepq.engine.emitter import StepEmitter
from stepq.engine.finish import advance, finish_limit
from stepq.engine.park import park
from stepq.engine.tool_exec import ToolExecution
from stepq.models import (
    EventType,
    LoopStop,
    PlanStep,
    StepOutput,
    StepTrace,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolResultStatus,
    TurnState,
)
from stepq.store.tool_results import ToolResultStore


def run_tools(ctx: StepContext, call: ModelCall, output: StepOutput, trace: StepTrace) -> Decision:
    """Run the answer's tool calls (or park on those that wait), then decide what comes next."""
    state, emitter = ctx.state, ctx.emitter
    calls = output.message.tool_calls
    state.messages.append(output.message)
    ran = runnable(ctx.agent, calls)  # the rest are answered "not run" (one tool call per step)
    over_budget = _over_budget(ctx, calls, len(ran))
    if over_budget is not None:
        return over_budget
    dispatcher = dispatcher_for(ctx, call.adapter.tool_failure_breaker)
    prepared = [dispatcher.prepare(c, i) for i, c in enumerate(calls)]
    for p in prepared:
        emitter.defer(EventType.TOOL_CALL, {"id": p.call.id, "name": p.call.name, "args": p.call.args})
    update_plan(state, emitter, task_plan.mark_running(state.plan, calls))
    stored = _checkpoint_or_stored(ctx, dispatcher, output, calls)
    results: dict[str, ToolResult] = {}
    for p in prepared:
        if p.waits:  # for a person's approval, or for a client-side tool's result
            continue
        results[p.call.id] = stored.get(p.call.id) or dispatcher.execute(p)
        publish_result(emitter, results[p.call.id])
    waiting = [p for p in prepared if p.waits and p.call.id not in stored]
    for p in prepared:
        if p.waits and p.call.id in stored:
            results[p.call.id] = stored[p.call.id]
    update_plan(state, emitter, task_plan.after_results(state.plan, calls, results))
    if waiting:
        return park(ctx, output, trace, waiting)
    state.messages.append(ToolResultMessage(results=[results[c.id] for c in calls]))
    state.tool_calls_made += len(ran)
    return after_tools(ctx, ran)


def _over_budget(ctx: StepContext, calls: list[ToolCall], running: int) -> Decision | None:
    """The `running` calls would overspend the turn's tool-call budget: none of them runs. None: within budget."""
    state = ctx.state
    limits = state.limits
    if limits.max_tool_calls is None or state.tool_calls_made + running <= limits.max_tool_calls:
        return None
    if stopping.reserve_answer(state, ctx.agent, LoopStop.TOOL_CALL_BUDGET):  # the calls are not run
        note = "not run: the turn's tool-call budget is spent; give your final answer now"
        state.messages.append(ToolResultMessage(results=[refusal(c, note) for c in calls]))
        tracing.record_calls(state, calls)
        return advance(ctx)
    return finish_limit(ctx, LoopStop.TOOL_CALL_BUDGET)


def _checkpoint_or_stored(
    ctx: StepContext, dispatcher: StepDispatcher, output: StepOutput, calls: list[ToolCall]
) -> dict[str, ToolResult]:
    """A first run checkpoints the answer (no results exist yet); a replayed one finds its stored results."""
    if ctx.checkpoint is not None:
        ctx.emitter.flush()  # subscribers learn of the calls before any tool runs
        return dispatcher.stored(calls)
    # A re-run of this step replays this answer (same calls, same ids), so results stored by
    # tool-call id keep side effects to one execution. Before a tool with side effects runs, the
    # answer is durable; read-only tools (safe to run again) do not wait for it: it rides the
    # step's next write (or the flush window, for a slow tool), and the commit supersedes it.
    turns, step = ctx.rt.turns, ctx.state.step
    save = turns.checkpoint_write(ctx.state.turn_id, step, "")
    ctx.emitter.defer_write(save.script, save.keys, lambda: turns.checkpoint_args(step, output.model_dump_json()))
    ctx.pending_checkpoint = save  # serialized only if it is written before the commit
    return {}  # results exist only once a checkpoint does


def dispatcher_for(ctx: StepContext, provider_breaker: int | None) -> StepDispatcher:
    """The step's dispatcher: results ride the step's event writes; tools see the lease's cancel flag."""
    breaker = ctx.agent.tool_failure_breaker or provider_breaker
    rt, s = ctx.rt, ctx.rt.settings
    sink = _EmitterResultSink(rt.tool_results, ctx.emitter, ctx.state.turn_id)
    execution = ToolExecution(s, ctx.lease.cancelled, step_deadline(ctx.state, ctx.agent))
    return StepDispatcher(ctx.agent, ctx.state, rt.tool_results, sink, breaker, s.max_tool_result_chars, execution)


def publish_result(emitter: StepEmitter, result: ToolResult) -> None:
    """`tool-result`, deferred to the step's next write."""
    emitter.defer(
        EventType.TOOL_RESULT,
        {
            "id": result.tool_call_id,
            "name": result.name,
            "output": result.output,
            "is_error": result.is_error,
            "status": result.status.value,
        },
    )


def update_plan(state: TurnState, emitter: StepEmitter, plan: list[PlanStep] | None) -> None:
    """Store a changed task plan with the turn and stream it whole (`plan-update`)."""
    if plan is not None:
        state.plan = plan
        emitter.defer(EventType.PLAN_UPDATE, task_plan.event_data(plan))


def refusal(call: ToolCall, error: str, **extra: object) -> ToolResult:
    """The result of a gated call that was not run (expired, denied, or approved for other arguments)."""
    denied = ToolResultStatus.DENIED
    return ToolResult(
        tool_call_id=call.id,
        name=call.name,
        is_error=True,
        output={"error": error, "status": denied.value, **extra},
        status=denied,
    )


class _EmitterResultSink:
    """Tool results ride in the step's next event write: the next tool's settle, or the commit's trip."""

    def __init__(self, store: ToolResultStore, emitter: StepEmitter, turn_id: str) -> None:
        self._store = store
        self._emitter = emitter
        self._turn_id = turn_id

    def store(self, result: ToolResult) -> None:
        self._emitter.defer_write(*self._store.put_write(self._turn_id, result))

    def settle(self) -> None:
        self._emitter.settle()
