"""The stage after the model answered: trace the step, then advance, finish, or stop on a loop limit.

`record_answer` writes what the step cost and did into its trace (written with the step's last commit,
never rewritten). A malformed answer is asked again once; an answer without tool calls (or object
mode's answer) is the final answer, repaired against the schema while the repair budget and the steps
last. After a tool step, `after_tools` checks the loop's limits (engine/stopping.py): object mode turns
a limit into one reserved answer step instead of ending without its object.
"""

from __future__ import annotations

import time

from stepq.engine import lifecycle, stopping, tracing
from stepq.engine.begin import ModelCall, policy_trace
from stepq.engine.context import Decision, StepContext
from stepq.engine.finish import advance, fail, finish, finish_limit
from stepq.engine.output import parse_object, repair_note
from stepq.engine.pricing import add_costs, step_cost
from stepq.errors import InvalidOutputError
from stepq.models import EventType, StepOutput, StepTrace, ToolCall, TurnStatus, UserMessage


def record_answer(ctx: StepContext, call: ModelCall, output: StepOutput, started: float) -> StepTrace:
    """The step's trace and totals (its failed attempts' cost included); `step-finish` is deferred."""
    state = ctx.state
    cost = step_cost(ctx.rt.settings.prices, state.provider, state.model, output.usage, batch=output.batched)
    failed, state.failed_attempts = state.failed_attempts, []
    replayed = ctx.checkpoint is not None
    lifecycle.attempt_ended(ctx, "ok", usage=output.usage, finish_reason=output.finish_reason.value, replayed=replayed)
    repairing = bool(state.trace.steps) and state.trace.steps[-1].invalid_output
    trace = StepTrace(
        step=state.step,
        provider=state.provider,
        model=state.model,
        tool_calls=[c.name for c in output.message.tool_calls],
        usage=output.usage,
        cost=add_costs(cost, *(f.cost for f in failed)),
        failed_attempts=failed,
        retries=state.attempt,
        duration_s=round(time.monotonic() - started, 4),
        stop_reason=output.finish_reason.value,
        raw_stop_reason=output.raw_finish_reason,
        tools=[t.name for t in call.specs],
        tool_choice=call.tool_choice,
        max_output_tokens=call.plan.max_output_tokens,
        warnings=call.plan.warnings,
        repair=repairing,
        batch=output.batched,
        policy=policy_trace(ctx),
        fingerprint=state.running_fingerprint,
        agent_version=state.running_version,
    )
    lifecycle.stamp(trace, ctx)
    state.usage = state.usage + output.usage
    state.cost = add_costs(state.cost, cost)  # failed attempts were added when they failed
    state.trace.steps.append(trace)
    state.attempt = 0
    state.not_before = None
    ctx.emitter.defer(EventType.STEP_FINISH, {"usage": output.usage.model_dump(), "finish_reason": trace.stop_reason})
    return trace


def retry_malformed(ctx: StepContext, call: ModelCall, output: StepOutput, trace: StepTrace) -> Decision | None:
    """A malformed answer (the adapter says which) is asked again once, with the adapter's note."""
    state = ctx.state
    if state.malformed_retry_used or not call.adapter.is_malformed(output):
        return None
    state.malformed_retry_used = True
    trace.malformed = True
    state.messages.append(UserMessage(content=call.adapter.malformed_note()))
    return advance(ctx)


def final_answer(ctx: StepContext, output: StepOutput) -> Decision:
    """The turn's answer: completed, or (object mode) repaired or failed when it does not match the schema."""
    state, agent = ctx.state, ctx.agent
    text = output.message.text
    if agent.execution_mode == "object":
        try:
            state.object = parse_object(agent, text)
        except InvalidOutputError as exc:
            traced = tracing.this_step(state)
            if traced is not None:
                traced.invalid_output = True
            if state.repairs_used < agent.output_repairs and stopping.steps_left(state):
                state.repairs_used += 1
                state.messages.append(output.message)
                state.messages.append(UserMessage(content=repair_note(agent, str(exc))))
                # the invalid answer's object deltas are void: the repair step streams a new one
                ctx.emitter.publish(
                    EventType.STEP_RESET, {"reason": "repairing an answer that did not match the schema"}
                )
                return advance(ctx)
            state.messages.append(output.message)
            return fail(ctx, f"the answer does not match the output schema: {exc}")
    state.messages.append(output.message)
    state.text = text
    state.stopped_by = state.answer_due  # the limit that cut the tool steps short, if one did
    return finish(ctx, TurnStatus.COMPLETED, output.finish_reason)


def after_tools(ctx: StepContext, calls: list[ToolCall]) -> Decision:
    """A tool step is done (its results in the transcript): the next step, or the limit that ends the loop."""
    state, agent = ctx.state, ctx.agent
    tracing.record_calls(state, calls, ctx.tool_timings)  # written with the step's commit, sizes and times included
    if agent.execution_mode == "object" and state.answer_due is not None:  # the answer step called tools
        return finish_limit(ctx, state.answer_due)
    try:
        stop = stopping.loop_stop(state, agent, calls)
    except stopping.StopConditionError as exc:
        return fail(ctx, str(exc))
    if stop is None:
        return advance(ctx)
    if stopping.reserve_answer(state, agent, stop):
        return advance(ctx)  # the reserved answer step
    return finish_limit(ctx, stop)
