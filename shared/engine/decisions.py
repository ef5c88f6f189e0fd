"""Deciding an approval (the work of the `approve` task) and sweeping turns nobody is running.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from stepq.agents.tools import ToolDefinition
from stepq.approvals import ApprovalClaim, canonical_args_hash
from stepq.engine.edits import edited_binding
from stepq.engine.upgrade import pinned_queue
from stepq.errors import ApprovalError, ApprovalRefusal
from stepq.fleet.metrics import untrack_pending
from stepq.fleet.runtime import Runtime
from stepq.models import EventType, TurnState, TurnStatus
from stepq.store.approvals import ApprovalRecord
from stepq.store.indexes import ACTIVE, AWAITING
from stepq.turns.client_results import client_results_in

log = logging.getLogger("stepq.sweeper")


@dataclass(frozen=True)
class ApprovalOutcome:
    accepted: bool
    code: str  # accepted: the decision ("approved" / "denied"); refused: an ApprovalRefusal
    message: str
    resume: tuple[str, int, str] | None = None  # (turn_id, step, priority) to enqueue once fully decided


def decide_approval(
    rt: Runtime,
    approval_id: str,
    token: str,
    approved: bool,
    *,
    reason: str = "",
    reviewer: str = "",
    args: dict[str, object] | None = None,
) -> ApprovalOutcome:
    """Verify the capability and record the decision once. Never raises for a refused decision."""
    try:
        return _decide(rt, approval_id, token, approved, reason, reviewer, args)
    except ApprovalError as exc:
        return ApprovalOutcome(False, exc.code, str(exc))


def _decide(
    rt: Runtime,
    approval_id: str,
    token: str,
    approved: bool,
    reason: str,
    reviewer: str,
    args: dict[str, object] | None,
) -> ApprovalOutcome:
    record = rt.approvals.get(approval_id) if isinstance(approval_id, str) and approval_id else None
    if record is None:
        raise ApprovalError.unknown(approval_id)
    claim = ApprovalClaim(
        record.approval_id,
        record.turn_id,
        record.tool_call_id,
        record.tool_name,
        record.args_hash,
        record.expires_at,
    )
    if not isinstance(token, str) or not rt.signer.verify(claim, token):
        raise ApprovalError(
            ApprovalRefusal.INVALID_TOKEN, f"approval {approval_id}: the token is not valid for this approval"
        )
    edit = None
    if args is not None and canonical_args_hash(dict(args)) != record.args_hash:
        edit = edited_binding(rt.signer, record, args, approved, _tool_of(rt, record))
    now = time.time()
    if record.status == "pending":
        _check_turn_waits(rt, record, now)
    refusal, status = rt.approvals.decide(
        approval_id, approved, reviewer[:200], reason[:2000], now, edit, tenant=record.tenant
    )
    if refusal in (None, ApprovalRefusal.EXPIRED):
        untrack_pending(rt, approval_id)  # no longer waiting for a person (stepq_pending_approvals)
    if refusal == ApprovalRefusal.EXPIRED:
        _publish_decision(rt, record.turn_id, record.step, approval_id, record.tool_call_id, "expired", "", "")
        return ApprovalOutcome(
            False,
            ApprovalRefusal.EXPIRED,
            f"approval {approval_id} expired; it resolves as a denial",
            resume=_resume_target(rt, record.turn_id, record.step),
        )
    if refusal == ApprovalRefusal.TURN_NOT_WAITING:
        raise ApprovalError(refusal, f"approval {approval_id} was cancelled: its turn ended before the decision")
    if refusal is not None:
        raise ApprovalError(refusal, f"approval {approval_id} is already {status}")
    decision = "approved" if approved else "denied"
    extra = {"edited": True, "args": edit[0]} if edit is not None else {}
    _publish_decision(
        rt, record.turn_id, record.step, approval_id, record.tool_call_id, decision, reviewer, reason, **extra
    )
    return ApprovalOutcome(
        True, decision, f"approval {approval_id} {decision}", resume=_resume_target(rt, record.turn_id, record.step)
    )


def _tool_of(rt: Runtime, record: ApprovalRecord) -> ToolDefinition | None:
    """The tool the approval's turn runs under the record's name: its agent's, not another module's namesake."""
    state = rt.turns.load(record.turn_id)
    agent = rt.agents.get(state.agent) if state is not None else None
    return agent.tool(record.tool_name) if agent is not None else None


def _check_turn_waits(rt: Runtime, record: ApprovalRecord, now: float) -> None:
    """A decision counts only while its turn is parked on the approval's step. The turn's end cancels its
    approvals; this catches one whose turn ended some other way (or just now), and cancels it too."""
    state = rt.turns.load(record.turn_id)
    if state is not None and state.status.parked and state.step == record.step:
        return
    rt.approvals.cancel([record.approval_id], now, "turn no longer waiting", record.tenant)
    untrack_pending(rt, record.approval_id)
    where = "gone (expired)" if state is None else state.status.value
    raise ApprovalError(
        ApprovalRefusal.TURN_NOT_WAITING,
        f"approval {record.approval_id}: turn {record.turn_id} is {where} and no longer waits for a decision",
    )


def _publish_decision(
    rt: Runtime,
    turn_id: str,
    step: int,
    approval_id: str,
    call_id: str,
    decision: str,
    reviewer: str,
    reason: str,
    **extra: object,
) -> None:
    data: dict[str, object] = {"approval_id": approval_id, "tool_call_id": call_id, "decision": decision, **extra}
    if reviewer:
        data["reviewer"] = reviewer
    if reason:
        data["reason"] = reason
    rt.events.publish(turn_id, EventType.APPROVAL_DECISION, step, data)


def _resume_target(rt: Runtime, turn_id: str, step: int) -> tuple[str, int, str] | None:
    """The step to resume when none of its approvals is still pending."""
    state = rt.turns.load(turn_id)
    if state is None or state.step != step or not _fully_decided(rt, state):
        return None
    # owed a resume from now on: the sweeper watches it (a worker killed while the approved tool runs, or a
    # lost message) until the resumed step commits and moves it on
    rt.turns.indexes.add(ACTIVE, turn_id, time.time())
    return (turn_id, step, state.priority)


def _fully_decided(rt: Runtime, state: TurnState) -> bool:
    """A parked turn none of whose approvals still waits for a person (decided or expired), and, once its
    status says it waits only for client-side results, all of those in (stored, or expired)."""
    if not state.status.parked or state.parked is None:
        return False
    if state.status == TurnStatus.AWAITING_TOOL_RESULTS and not client_results_in(rt, state, time.time()):
        return False
    records = rt.approvals.get_many([a.approval_id for a in state.parked.approvals])
    now = time.time()
    for pending in state.parked.approvals:
        rec = records.get(pending.approval_id)
        if rec is not None and rec.status == "pending" and now < rec.expires_at:
            return False
    return True


def sweep(rt: Runtime, queued_grace_s: float) -> list[tuple[str, int, str]]:
    """Turns to re-enqueue: running with no live lease and a step that started but never committed,
    queued/running with no progress for `queued_grace_s` or since a broker reconnect (a lost message),
    or parked past an expiry."""
    if not rt.redis.set(rt.keys.sweep_lock, "1", nx=True, px=max(int(rt.settings.sweep_interval_s * 800), 50)):
        return []
    now = time.time()
    reconnected = float(rt.redis.get(rt.keys.broker_reconnected) or 0.0)  # see stepq.workers.reconnects
    found: list[tuple[str, int, str]] = []
    indexes = rt.turns.indexes
    for turn_id, score in indexes.due(ACTIVE, now - min(rt.settings.lease_ttl_s, queued_grace_s)):
        state = rt.turns.load(turn_id)
        parked = state is not None and state.status.parked
        if state is None or state.status.terminal or (parked and not _fully_decided(rt, state)):
            indexes.remove_if(ACTIVE, turn_id, score)  # ended, or waiting for a person (the awaiting index's job)
            continue
        if _waits_in_thread(rt, state):
            indexes.remove_if(ACTIVE, turn_id, score)  # its thread starts it (and lists it) when its turn comes
            continue
        if rt.redis.exists(rt.keys.lease(turn_id)):
            continue
        if state.not_before and state.not_before > now:
            continue
        crashed = rt.leases.started_step(turn_id) == state.step
        sent = rt.turns.sent_step(turn_id)
        # committed at this step, but the message for it never went out: the worker died in between
        unsent = not parked and sent is not None and sent < state.step
        # a decided parked turn was last touched when its decision enqueued the resume (its index score)
        touched = score if parked else state.updated_at
        # untouched since a worker's consumer reconnected: the outage may have stranded its message
        stranded = score < reconnected <= now  # (the score: a re-send moves it past the mark)
        if pinned_queue(state) and not (crashed or unsent or stranded):
            continue  # its step waits in its pinned queue for a worker of its definition (`stepq drain` lists it)
        if crashed or unsent or stranded or touched < now - queued_grace_s:
            if crashed:
                log.info("sweeper: recovered turn %s step %s (its worker died mid-step)", turn_id, state.step)
            else:
                why = "never sent" if unsent else "stranded by a broker reconnect" if stranded else "lost"
                log.info("sweeper: re-sent turn %s step %s (its step message was %s)", turn_id, state.step, why)
            found.append((turn_id, state.step, state.priority))
            indexes.add(ACTIVE, turn_id, now, only_existing=True)
    for turn_id, score in indexes.due(AWAITING, now):
        state = rt.turns.load(turn_id)
        # parked past an expiry, or past its provider batch's deadline (the step then runs online)
        if state is None or not (state.status.parked or state.status == TurnStatus.AWAITING_BATCH):
            indexes.remove_if(AWAITING, turn_id, score)
            continue
        log.info("sweeper: turn %s step %s expired while %s; it goes on", turn_id, state.step, state.status.value)
        found.append((turn_id, state.step, state.priority))
        indexes.add(AWAITING, turn_id, now + rt.settings.lease_ttl_s, only_existing=True)
    return found


def _waits_in_thread(rt: Runtime, state: TurnState) -> bool:
    """A thread's turn still queued behind the turn its thread runs (listed by a submitter that died before
    taking it off again): not the sweeper's to start."""
    if state.thread_id is None or state.status != TurnStatus.QUEUED or state.step != 0:
        return False
    return rt.threads.running(state.thread_id) != state.turn_id
