"""Deferred tool calls (submit's `defer_tools=True`): every call of the turn parks for its caller, who runs it.

The dispatcher marks each valid call of a deferring turn as the caller's (engine/dispatch.py), so the step
parks on it exactly as on a client-side tool's call (engine/client_tools.py): a `tool-results-request`, then
`Client.resume` with the results. Deferral is never a way around an approval: a call that needs one parks
for its reviewer first and reaches the caller only once approved (here, when the step resumes); a denied
or expired one is refused as always, and the caller cannot send a result for it (it is never an open call).
"""

from __future__ import annotations

import time
from typing import Any

from stepq.approvals import canonical_args_hash
from stepq.engine import client_tools, edits
from stepq.engine.context import Decision, StepContext, none
from stepq.models import EventType, ParkedStep, PendingToolCall, StepLoss, TurnStatus
from stepq.store.approvals import ApprovalRecord


def hand_over_approved(ctx: StepContext, parked: ParkedStep, records: dict[str, ApprovalRecord]) -> Decision | None:
    """A deferring turn's newly approved calls go to the caller (the step parks for their results). None:
    nothing to hand over (not deferring, or every approved call is already the caller's)."""
    state = ctx.state
    if not state.defer_tools:
        return None
    open_ids = {c.tool_call_id for c in parked.client_calls}
    handed: list[PendingToolCall] = []
    ttl = ctx.agent.approval_ttl_s or ctx.rt.settings.approval_ttl_s
    expires_at = round(time.time() + ttl, 3)
    for pending in parked.approvals:
        record = records.get(pending.approval_id)
        if record is None or record.status != "approved" or pending.tool_call_id in open_ids:
            continue
        args = _approved_args(ctx, record)
        if args is not None:  # else resume refuses the call, as for a run on the workers
            handed.append(PendingToolCall(tool_call_id=pending.tool_call_id, tool_name=pending.tool_name,
                                          args=args, expires_at=expires_at))  # fmt: skip
    if not handed:
        return None
    # one window for every open call (they settle together): it restarts now
    earlier = [c.model_copy(update={"expires_at": expires_at}) for c in parked.client_calls]
    parked.client_calls = [*earlier, *handed]
    state.status = TurnStatus.AWAITING_TOOL_RESULTS
    if not ctx.commit():
        return none(StepLoss.COMMIT_LOST)
    ctx.emitter.publish(EventType.TOOL_RESULTS_REQUEST, client_tools.request_event(handed))
    return none("approved calls handed to the caller")


def _approved_args(ctx: StepContext, record: ApprovalRecord) -> dict[str, Any] | None:
    """The arguments the reviewer approved: the call's own, or the edit whose signed binding verifies."""
    if record.edited_args is None:
        return dict(record.args or {}) if canonical_args_hash(record.args or {}) == record.args_hash else None
    return edits.verified_edit(ctx.rt.signer, record, record.args_hash)
