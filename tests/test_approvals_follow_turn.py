"""Approvals follow their turn: a turn that ends while parked cancels its pending approvals, and a decision
on a turn that no longer waits is refused (`turn-not-waiting`) without touching the record or the stream."""

from __future__ import annotations

import time

import pytest

from stepq.approvals import ApprovalClaim
from stepq.engine.decisions import decide_approval
from stepq.engine.runner import StepRunner
from stepq.errors import ApprovalError, ApprovalRefusal
from stepq.models import EventType, TurnStatus
from stepq.store.approvals import ApprovalRecord
from stepq.turns.submit import create_turn
from tests.test_durability import _side_effects


def _parked(rt, prefix, agent="rt.approver"):
    state, _ = create_turn(rt, agent, prompt="go", metadata={"prefix": prefix})
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"
    assert rt.turns.load(state.turn_id).status == TurnStatus.AWAITING_APPROVAL
    requests = [e.data for e in rt.events.read(state.turn_id) if e.type == EventType.APPROVAL_REQUEST]
    return state.turn_id, requests


def _decide(rt, approval_id, approved=True):
    return decide_approval(rt, approval_id, rt.approvals.get(approval_id).token, approved, reviewer="ops")


def test_cancelling_a_parked_turn_cancels_its_approvals_and_refuses_later_decisions(rt, prefix):
    turn_id, [request] = _parked(rt, prefix)
    rt.turns.request_cancel(turn_id)
    assert StepRunner(rt).deliver(turn_id, 0).action == "none"
    assert rt.turns.load(turn_id).status == TurnStatus.CANCELLED
    assert rt.approvals.get(request["approval_id"]).status == "cancelled"
    before = rt.events.last_seq(turn_id)

    outcome = _decide(rt, request["approval_id"])

    assert not outcome.accepted and outcome.code == ApprovalRefusal.TURN_NOT_WAITING
    assert outcome.resume is None
    assert rt.approvals.get(request["approval_id"]).status == "cancelled"
    assert rt.events.last_seq(turn_id) == before  # no approval-decision after turn-finish
    assert rt.events.read(turn_id)[-1].type == EventType.TURN_FINISH
    assert _side_effects(prefix, turn_id, "gated") == 0


def test_a_decision_made_before_the_cancel_keeps_its_record(rt, prefix):
    turn_id, requests = _parked(rt, prefix, "rt.approver_two")
    first, second = (r["approval_id"] for r in requests)
    assert _decide(rt, first).accepted
    rt.turns.request_cancel(turn_id)
    StepRunner(rt).deliver(turn_id, 0)
    assert rt.turns.load(turn_id).status == TurnStatus.CANCELLED
    assert rt.approvals.get(first).status == "approved"  # decided while the turn waited: stays decided
    assert rt.approvals.get(second).status == "cancelled"
    assert _decide(rt, second).code == ApprovalRefusal.TURN_NOT_WAITING
    assert _decide(rt, first).code == ApprovalRefusal.NOT_PENDING
    assert _side_effects(prefix, turn_id, "a") == 0 and _side_effects(prefix, turn_id, "b") == 0


def test_a_pending_approval_of_a_turn_that_ended_otherwise_is_refused_and_cancelled(rt, prefix):
    """A still-pending record whose turn is no longer parked on its step (it ended another way): refused."""
    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
    runner = StepRunner(rt)
    while runner.deliver(state.turn_id, rt.turns.load(state.turn_id).step).action == "next":
        runner = StepRunner(rt)
    assert rt.turns.load(state.turn_id).status == TurnStatus.COMPLETED
    expires = round(time.time() + 600, 3)
    claim = ApprovalClaim("apv_orphan" + prefix, state.turn_id, "call_1", "rt_echo", "0" * 64, expires)
    rt.approvals.create(
        ApprovalRecord(
            approval_id=claim.approval_id,
            turn_id=state.turn_id,
            step=0,
            tool_call_id="call_1",
            tool_name="rt_echo",
            args={"text": "x"},
            args_hash="0" * 64,
            expires_at=expires,
            token=rt.signer.sign(claim),
        )
    )
    outcome = _decide(rt, claim.approval_id)
    assert not outcome.accepted and outcome.code == ApprovalRefusal.TURN_NOT_WAITING
    assert "completed" in outcome.message
    assert rt.approvals.get(claim.approval_id).status == "cancelled"


def test_client_sees_the_refusal_code(worker, client, prefix):
    handle = client.submit("rt.approver", prompt="go", metadata={"prefix": prefix})
    request = next(e for e in handle.events(idle_timeout=60) if e.type == EventType.APPROVAL_REQUEST)
    handle.cancel()
    assert handle.wait(timeout=60).status == TurnStatus.CANCELLED
    with pytest.raises(ApprovalError) as err:
        client.approve(request.data["approval_id"], True).wait(30)
    assert err.value.code == ApprovalRefusal.TURN_NOT_WAITING
    assert [e.type for e in handle.events()][-1] == EventType.TURN_FINISH
