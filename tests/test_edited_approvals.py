"""Approving an editable tool's call with edited arguments: validated, re-bound, verified by the worker."""

from __future__ import annotations

import json

import pytest

from stepq.errors import ApprovalError, ApprovalRefusal
from stepq.models import AssistantMessage, EventType, TurnStatus
from tests.conftest import eventually
from tests.test_cli import stepq

WAIT = 120


def _parked(client, agent, prefix):
    handle = client.submit(agent, prompt="go", metadata={"prefix": prefix})
    for event in handle.events(idle_timeout=WAIT):
        if event.type == EventType.APPROVAL_REQUEST:
            eventually(lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL, what="parked")
            return handle, event.data
        assert event.type != EventType.TURN_FINISH, event.data
    raise AssertionError("no approval request")


def _count(rt, prefix, turn_id, order, amount):
    return int(rt.redis.get(f"{prefix}:side-effects:{turn_id}:{order}:{amount}") or 0)


def test_an_editable_call_runs_once_with_the_reviewers_arguments(worker, client, prefix, rt):
    handle, request = _parked(client, "ct.editor", prefix)
    approval = request["approval_id"]
    # not the tool's schema: refused, nothing decided
    with pytest.raises(ApprovalError) as err:
        client.approve(approval, True, args={"order_id": "A-1", "amount_eur": "lots"}).wait(30)
    assert err.value.code == ApprovalRefusal.INVALID_ARGS and "amount_eur" in str(err.value)
    with pytest.raises(ApprovalError) as err:  # a denial carries no arguments
        client.approve(approval, False, args={"order_id": "A-1", "amount_eur": 20}).wait(30)
    assert err.value.code == ApprovalRefusal.CHANGED_ARGS
    assert rt.approvals.get(approval).status == "pending"

    assert client.approve(approval, True, args={"order_id": "A-1", "amount_eur": 20}, reviewer="ana").wait(30)
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert _count(rt, prefix, handle.turn_id, "A-1", 20.0) == 1 and _count(rt, prefix, handle.turn_id, "A-1", 50.0) == 0
    assert '"refunded_eur": 20.0' in result.text
    [decision] = [e for e in handle.events() if e.type == EventType.APPROVAL_DECISION]
    assert decision.data["edited"] is True and decision.data["args"] == {"order_id": "A-1", "amount_eur": 20.0}
    # the transcript shows the model the call that ran, with the reviewer's arguments
    [call] = [c for m in result.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    assert call.args == {"order_id": "A-1", "amount_eur": 20.0}
    # a second decision, edited or not, is refused
    with pytest.raises(ApprovalError) as err:
        client.approve(approval, True, args={"order_id": "A-1", "amount_eur": 30}).wait(30)
    assert err.value.code == ApprovalRefusal.NOT_PENDING


def test_a_tool_that_is_not_editable_refuses_other_arguments(worker, client, prefix, rt):
    handle, request = _parked(client, "ct.deleter", prefix)
    with pytest.raises(ApprovalError) as err:
        client.approve(request["approval_id"], True, args={"order_id": "B-2"}).wait(30)
    assert err.value.code == ApprovalRefusal.CHANGED_ARGS and "not editable" in str(err.value)
    assert client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL
    client.cancel(handle.turn_id)


def test_a_tampered_edit_does_not_run(worker, client, prefix, rt):
    handle, request = _parked(client, "ct.editor", prefix)
    approval = request["approval_id"]
    key = rt.keys.approval(approval)
    # hold the step back while the record is tampered with after the decision: take the turn's lease
    rt.redis.set(rt.keys.lease(handle.turn_id), "held-by-test", px=60_000)
    assert client.approve(approval, True, args={"order_id": "A-1", "amount_eur": 20}).wait(30)
    rt.redis.hset(key, "edited_args", json.dumps({"order_id": "A-1", "amount_eur": 9999.0}))
    rt.redis.delete(rt.keys.lease(handle.turn_id))
    client._send_step(handle.turn_id, client.get(handle.turn_id).step, "interactive")
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert "the edited approval does not verify; not run" in result.text
    assert (
        _count(rt, prefix, handle.turn_id, "A-1", 9999.0) == 0 and _count(rt, prefix, handle.turn_id, "A-1", 20.0) == 0
    )


def test_cli_approve_with_args(worker, client, prefix, rt, settings):
    from tests.conftest import settings_env

    env = settings_env(settings)
    handle, request = _parked(client, "ct.editor", prefix)
    proc = stepq(env, "approve", request["approval_id"], "--yes", "--args", "{not json", check=2)
    assert proc.stderr.startswith("stepq: error: --args is not valid JSON") and proc.stderr.count("\n") == 1
    proc = stepq(env, "approve", request["approval_id"], "--yes", "--args", '{"order_id": "A-1", "amount_eur": 5}')
    assert proc.returncode == 0 and "accepted" in proc.stdout, proc.stderr
    assert '"refunded_eur": 5.0' in handle.wait(timeout=WAIT).text
