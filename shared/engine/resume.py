"""Resuming a parked step: each waiting call's outcome once its approval is decided (or lapsed) and its
client-side result is in, then the step goes on as if its tools had just run.

An approved call runs only if the approval still matches the call's arguments; approved with edited
arguments, it runs those only if their signed binding verifies (engine/edits.py). Denied, expired or
cancelled approvals become refusal results the model reads. Calls that were not gated run now, and
results stored before a crash are reused, so nothing runs twice.
"""

from __future__ import annotations

import time
from typing import Any

from stepq.agents import task_plan
from stepq.engine import client_tools, deferred, edits, tracing
from stepq.engine.context import Decision, StepContext, none
from stepq.engine.decide import after_tools
from stepq.engine.dispatch import StepDispatcher, runnable
from stepq.engine.finish import fail
from stepq.engine.park import await_tool_results
from stepq.engine.tools_stage import dispatcher_for, publish_result, refusal, update_plan
from stepq.models import EventType, ParkedStep, ToolCall, ToolResult, ToolResultMessage, ToolResultStatus, TurnStatus
from stepq.store.approvals import ApprovalRecord
from stepq.store.listings import tenant_of


def resume(ctx: StepContext) -> Decision:
    """A parked step's delivery: wait on, or settle, its calls; then decide what comes next."""
    state, emitter = ctx.state, ctx.emitter
    parked = state.parked
    if parked is None:
        return fail(ctx, "turn was awaiting approval with no parked step")
    now = time.time()
    records = ctx.rt.approvals.get_many([a.approval_id for a in parked.approvals])
    if _still_pending(ctx, parked, records, now):
        return none("approvals still pending")
    handed = deferred.hand_over_approved(ctx, parked, records)  # a deferring turn: approved calls go to the caller
    if handed is not None:
        return handed
    calls = parked.assistant.tool_calls
    dispatcher = dispatcher_for(ctx, None)
    answered = client_tools.settle(parked, dispatcher, now)
    if answered is None:  # the approvals are decided; client-side results are still to come
        return await_tool_results(ctx)
    for result in answered.values():
        publish_result(emitter, result)
    stored = {**dispatcher.stored(calls), **answered}
    by_call = {a.tool_call_id: records.get(a.approval_id) for a in parked.approvals}
    edited: dict[str, dict[str, Any]] = {}  # call id -> the arguments a reviewer approved instead
    results = _results(ctx, dispatcher, calls, stored, by_call, edited)
    gated = {r.tool_call_id: r for r in results if r.tool_call_id in by_call and r.tool_call_id not in stored}
    update_plan(state, emitter, task_plan.after_results(state.plan, calls, gated))
    state.messages.append(edits.with_args(parked.assistant, edited))
    state.messages.append(ToolResultMessage(results=results))
    ran = runnable(ctx.agent, calls)  # the others were answered "not run" when the step parked
    state.tool_calls_made += len(ran)
    state.parked = None
    state.status = TurnStatus.RUNNING
    parked.step_trace.resumed_at = round(now, 6)
    tracing.resume_trace(state, parked.step_trace)
    return after_tools(ctx, ran)


def _still_pending(ctx: StepContext, parked: ParkedStep, records: dict[str, ApprovalRecord], now: float) -> bool:
    """True while an approval waits within its time; a lapsed one is marked expired (and announced)."""
    for pending in parked.approvals:
        record = records.get(pending.approval_id)
        if record is not None and record.status == "pending":
            if now < record.expires_at:
                return True
            ctx.rt.approvals.expire(pending.approval_id, now, tenant_of(ctx.state))
            record.status = "expired"
            ctx.emitter.publish(
                EventType.APPROVAL_DECISION,
                {
                    "approval_id": pending.approval_id,
                    "tool_call_id": pending.tool_call_id,
                    "decision": "expired",
                },
            )
    return False


def _results(
    ctx: StepContext,
    dispatcher: StepDispatcher,
    calls: list[ToolCall],
    stored: dict[str, ToolResult],
    by_call: dict[str, ApprovalRecord | None],
    edited: dict[str, dict[str, Any]],
) -> list[ToolResult]:
    """Each call's result, in order: stored, run now (not gated), or as its approval decided."""
    results: list[ToolResult] = []
    for position, call in enumerate(calls):
        if call.id in stored:
            results.append(stored[call.id])
            continue
        if call.id not in by_call:
            results.append(dispatcher.execute(dispatcher.prepare(call, position)))  # not approval-gated
            continue
        result = _gated_result(ctx, dispatcher, call, by_call[call.id], edited)
        results.append(result)
        publish_result(ctx.emitter, result)
    return results


def _gated_result(
    ctx: StepContext,
    dispatcher: StepDispatcher,
    call: ToolCall,
    record: ApprovalRecord | None,
    edited: dict[str, dict[str, Any]],
) -> ToolResult:
    """An approval-gated call's result: run as approved (or as edited), or a refusal saying why not."""
    prepared = dispatcher.prepare(call)
    if record is None or record.status in ("expired", "cancelled"):
        status = record.status if record else "expired"
        return dispatcher.record(refusal(call, f"approval {status}: the tool was not run"))
    if record.status == "denied":
        reason = record.reason or "no reason given"
        return dispatcher.record(refusal(call, f"denied by reviewer: {reason}", do_not_retry=True))
    if record.edited_args is not None:  # approved with edited arguments: run them if their binding holds
        args = edits.verified_edit(ctx.rt.signer, record, prepared.args_hash) if prepared.error is None else None
        rerun = dispatcher.prepare(call.model_copy(update={"args": args})) if args is not None else None
        if args is not None and rerun and rerun.error is None and rerun.args_hash == record.edited_args_hash:
            edited[call.id] = args
            return dispatcher.execute(rerun)
        return dispatcher.record(refusal(call, "the edited approval does not verify; not run"))
    if prepared.error is not None:  # approved, but the call cannot run now: say why, not "changed"
        return dispatcher.record(_approved_not_runnable(call, prepared.error))
    if prepared.args_hash == record.args_hash:
        return dispatcher.execute(prepared)
    return dispatcher.record(refusal(call, "approval does not match the call's arguments; not run"))


def _approved_not_runnable(call: ToolCall, error: ToolResult) -> ToolResult:
    """An approved call that cannot run on resume. A tool the step no longer offers (a policy made the turn
    read-only or dropped the tool since the approval) is refused as such; any other reason (its arguments no
    longer validate, the tool's breaker is open) is the prepared error's own words. Never "the arguments
    changed" for arguments that did not."""
    if error.status == ToolResultStatus.NOT_FOUND:
        reason = (
            f"approved, but {call.name} is no longer allowed for this turn "
            "(a policy or the agent's tools changed since the approval); not run"
        )
        return refusal(call, reason, do_not_retry=True)
    return error
