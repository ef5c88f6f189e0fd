"""Parking a step on the tool calls that wait: a person's approval, or a client-side tool's result.

The parked step keeps the model's answer and its trace (`ParkedStep`), so the step resumes whole
(engine/resume.py) and its trace is written once, with the approved calls' results. Each approval gets
a record with a signed claim, kept server-side; the requests go out only once the park committed.
"""

from __future__ import annotations

import time
from typing import Any

from stepq.approvals import ApprovalClaim
from stepq.engine import client_tools
from stepq.engine.context import Decision, StepContext, none
from stepq.engine.dispatch import PreparedCall
from stepq.fleet.metrics import track_pending
from stepq.models import (
    EventType,
    ParkedStep,
    PendingApproval,
    StepLoss,
    StepOutput,
    StepTrace,
    TurnStatus,
    new_approval_id,
)
from stepq.store.approvals import ApprovalRecord
from stepq.store.keys import home
from stepq.store.listings import tenant_of


def park(ctx: StepContext, output: StepOutput, trace: StepTrace, waiting: list[PreparedCall]) -> Decision:
    """Park the step on its waiting calls; approval and client-tool requests go out after the commit."""
    state, rt, emitter = ctx.state, ctx.rt, ctx.emitter
    ttl = ctx.agent.approval_ttl_s or rt.settings.approval_ttl_s
    expires_at = round(time.time() + ttl, 3)
    pending, requests = _create_approvals(ctx, waiting, expires_at)
    state.parked = ParkedStep(
        assistant=output.message,
        step_usage=output.usage,
        raw_stop_reason=output.raw_finish_reason,
        finish_reason=output.finish_reason,
        approvals=pending,
        client_calls=client_tools.pending(waiting, expires_at),
        step_trace=trace,
    )
    state.messages.pop()  # the assistant message is re-added with the results on resume
    state.trace.steps.pop()  # so is the step's trace (kept in `parked`), complete with the results
    state.status = TurnStatus.AWAITING_APPROVAL if pending else TurnStatus.AWAITING_TOOL_RESULTS
    if not ctx.commit():
        return none(StepLoss.COMMIT_LOST)
    track_pending(rt, pending)  # stepq_pending_approvals counts this index
    for req in requests:
        emitter.publish(EventType.APPROVAL_REQUEST, req)
    if state.parked.client_calls:
        emitter.publish(EventType.TOOL_RESULTS_REQUEST, client_tools.request_event(state.parked.client_calls))
    return none(f"parked ({state.status.value})")


def _create_approvals(
    ctx: StepContext, waiting: list[PreparedCall], expires_at: float
) -> tuple[list[PendingApproval], list[dict[str, Any]]]:
    """One approval record per call that needs a reviewer, and the `approval-request` event of each."""
    state, rt = ctx.state, ctx.rt
    pending: list[PendingApproval] = []
    requests = []
    for p in waiting:
        if not p.needs_approval:
            continue
        assert p.args is not None
        approval_id = new_approval_id(home(state.turn_id))
        claim = ApprovalClaim(approval_id, state.turn_id, p.call.id, p.call.name, p.args_hash, expires_at)
        record = ApprovalRecord(
            approval_id=approval_id,
            turn_id=state.turn_id,
            step=state.step,
            tool_call_id=p.call.id,
            tool_name=p.call.name,
            args=p.args,
            args_hash=p.args_hash,
            expires_at=expires_at,
            token=rt.signer.sign(claim),  # kept server-side: the approve paths read it from here
            tenant=tenant_of(state),
            agent=state.agent,
        )
        rt.approvals.create(record, listed=False)
        ctx.emitter.defer_write(*rt.approvals.listing_write(record))  # rides with the parking commit
        pending.append(
            PendingApproval(
                approval_id=approval_id,
                tool_call_id=p.call.id,
                tool_name=p.call.name,
                args=p.args,
                expires_at=expires_at,
            )
        )
        requests.append(
            {
                "approval_id": approval_id,
                "tool_call_id": p.call.id,
                "tool": p.call.name,
                "args": p.args,
                "expires_at": expires_at,
            }
        )
    return pending, requests


def await_tool_results(ctx: StepContext) -> Decision:
    """Still parked, now only on client-side results: the status says so from here on."""
    state = ctx.state
    if state.status != TurnStatus.AWAITING_TOOL_RESULTS:
        state.status = TurnStatus.AWAITING_TOOL_RESULTS
        if not ctx.commit():
            return none(StepLoss.COMMIT_LOST)
    return none("waiting for client-side tool results")
