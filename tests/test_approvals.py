"""Approvals as capabilities: parked turns, signed tokens, decided once."""

from __future__ import annotations

import threading

import pytest

from stepq.engine.decisions import decide_approval, sweep
from stepq.engine.runner import StepRunner
from stepq.errors import ApprovalError
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, ToolResultMessage, TurnStatus
from stepq.turns.submit import create_turn
from tests.conftest import eventually, make_settings
from tests.test_durability import _side_effects

OLD_SECRET = "old-approval-secret-0123456789abcdef"  # 32+ bytes, as Settings requires
NEW_SECRET = "new-approval-secret-0123456789abcdef"


def _park(client, prefix, agent="rt.approver"):
    handle = client.submit(agent, prompt="go", metadata={"prefix": prefix})
    requests = []
    for event in handle.events(idle_timeout=60):
        if event.type == EventType.APPROVAL_REQUEST:
            requests.append(event)
        state = client.get(handle.turn_id)
        if requests and state.status == TurnStatus.AWAITING_APPROVAL and len(requests) == len(state.parked.approvals):
            break
    return handle, requests


def _tool_results(state):
    return {r.name: r for m in state.messages if isinstance(m, ToolResultMessage) for r in m.results}


def test_approve_runs_the_gated_call_once_and_resumes(worker, client, prefix, rt):
    handle, [request] = _park(client, prefix)
    state = client.get(handle.turn_id)
    assert state.status == TurnStatus.AWAITING_APPROVAL
    # parked: once the delivery returns, no worker holds the turn (and nothing renews a lease)
    eventually(lambda: not rt.redis.exists(rt.keys.lease(handle.turn_id)), what="the lease to be released")
    assert state.status == TurnStatus.AWAITING_APPROVAL
    assert _side_effects(prefix, handle.turn_id, "gated") == 0
    data = request.data
    assert data["tool"] == "rt_side_effect" and data["args"] == {"label": "gated"}
    assert data["expires_at"] > state.updated_at
    # the signed token stays server-side: any subscriber reads this event, so it must not carry it
    assert "token" not in data and "token" not in request.model_dump_json()
    assert client.runtime.approvals.get(data["approval_id"]).token
    # the call that needed no approval already ran, before anyone decided
    earlier = list(rt.events.read(handle.turn_id, 0, request.seq))
    assert any(e.type == EventType.TOOL_RESULT and e.data["name"] == "rt_echo" for e in earlier)

    assert client.approve(data["approval_id"], True, reviewer="ops@example", reason="ok").wait(30)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED and result.text == "done"
    assert _side_effects(prefix, handle.turn_id, "gated") == 1
    results = _tool_results(client.get(handle.turn_id))
    assert results["rt_side_effect"].output == {"label": "gated", "count": 1}
    decisions = [e for e in handle.events() if e.type == EventType.APPROVAL_DECISION]
    assert [d.data["decision"] for d in decisions] == ["approved"] and decisions[0].data["reviewer"] == "ops@example"
    # a replay of the same decision is refused
    with pytest.raises(ApprovalError) as err:
        client.approve(data["approval_id"], True).wait(30)
    assert err.value.code == "not-pending"


def test_one_call_per_step_parks_on_the_first_call_and_answers_the_rest_not_run(worker, client, prefix):
    """parallel_tool_calls=False on a provider that sent two calls: the first (gated) one parks and runs once
    approved; the second never runs, before the park or on resume, and only the first counts as made."""
    handle, [request] = _park(client, prefix, "rt.one_call_gated")
    assert request.data["tool"] == "rt_side_effect"

    assert client.approve(request.data["approval_id"], True, reviewer="ops@example").wait(30)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED and result.text == "done"
    assert _side_effects(prefix, handle.turn_id, "gated") == 1
    state = client.get(handle.turn_id)
    results = _tool_results(state)
    assert results["rt_side_effect"].status == "ok"
    echo = results["rt_echo"]
    assert echo.is_error and echo.status == "denied"
    assert echo.output["error"].startswith("not run: one tool call per step")
    assert state.tool_calls_made == 1


def test_deny_becomes_the_tool_result_the_model_sees(worker, client, prefix):
    handle, [request] = _park(client, prefix)
    data = request.data
    assert client.approve(data["approval_id"], False, reason="too risky").wait(30)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    assert _side_effects(prefix, handle.turn_id, "gated") == 0
    denied = _tool_results(client.get(handle.turn_id))["rt_side_effect"]
    assert denied.is_error and denied.output["error"] == "denied by reviewer: too risky"


def test_tampered_token_is_refused_and_changes_nothing(worker, client, prefix):
    handle, [request] = _park(client, prefix)
    data = request.data
    real = client.runtime.approvals.get(data["approval_id"]).token
    forged = real[:-1] + ("0" if real[-1] != "0" else "1")
    for token in (forged, "", "nokid", real.split(".")[1]):
        with pytest.raises(ApprovalError) as err:
            client.approve(data["approval_id"], True, token=token).wait(30)
        assert err.value.code == "invalid-token"
    assert client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL
    assert client.runtime.approvals.get(data["approval_id"]).status == "pending"
    assert client.approve(data["approval_id"], True).wait(30)
    assert handle.wait(timeout=60).status == TurnStatus.COMPLETED


def test_changed_args_are_refused(worker, client, prefix):
    handle, [request] = _park(client, prefix)
    data = request.data
    with pytest.raises(ApprovalError) as err:
        client.approve(data["approval_id"], True, args={"label": "something else"}).wait(30)
    assert err.value.code == "changed-args"
    assert client.approve(data["approval_id"], True, args={"label": "gated"}).wait(30)
    assert handle.wait(timeout=60).status == TurnStatus.COMPLETED


def test_unknown_approval_id_is_refused(worker, client):
    with pytest.raises(ApprovalError) as err:
        client.approve("apv_doesnotexist", True).wait(30)
    assert err.value.code == "unknown"


def test_two_concurrent_approves_exactly_one_wins(rt, prefix):
    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix})
    runner = StepRunner(rt)
    assert runner.deliver(state.turn_id, 0).action == "none"
    [request] = [e for e in rt.events.read(state.turn_id) if e.type == EventType.APPROVAL_REQUEST]
    token = rt.approvals.get(request.data["approval_id"]).token
    barrier = threading.Barrier(8)
    outcomes = []

    def decide(approved: bool) -> None:
        barrier.wait()
        outcomes.append(decide_approval(rt, request.data["approval_id"], token, approved))

    threads = [threading.Thread(target=decide, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.accepted]
    assert len(winners) == 1
    assert all(o.code == "not-pending" for o in outcomes if not o.accepted)
    assert rt.approvals.get(request.data["approval_id"]).status == winners[0].code


def test_step_resumes_only_when_every_approval_is_decided(worker, client, prefix):
    handle, requests = _park(client, prefix, "rt.approver_two")
    assert len(requests) == 2
    first, second = (r.data for r in requests)
    client.approve(first["approval_id"], True).wait(30)
    assert client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL
    client.approve(second["approval_id"], False, reason="no").wait(30)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    assert _side_effects(prefix, handle.turn_id, "a") == 1
    assert _side_effects(prefix, handle.turn_id, "b") == 0


def test_expired_approval_resolves_as_denial(worker, client, prefix):
    handle, [request] = _park(client, prefix, "rt.approver_expiring")
    data = request.data
    with pytest.raises(ApprovalError) as err:
        client.approve(data["approval_id"], True).wait(30)
    assert err.value.code == "expired"
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    assert _side_effects(prefix, handle.turn_id, "late") == 0
    expired = _tool_results(client.get(handle.turn_id))["rt_side_effect"]
    assert expired.is_error and "expired" in expired.output["error"]


def test_sweeper_resolves_expired_approvals_nobody_answered(rt, prefix):
    state, _ = create_turn(rt, "rt.approver_expiring", prompt="go", metadata={"prefix": prefix})
    runner = StepRunner(rt)
    runner.deliver(state.turn_id, 0)
    assert rt.turns.load(state.turn_id).status == TurnStatus.AWAITING_APPROVAL
    # the sweeper is periodic and takes a short lock per pass: run passes until one acts
    eventually(
        lambda: (state.turn_id, 0, "interactive") in sweep(rt, queued_grace_s=300), what="a sweep to find the turn"
    )
    assert runner.deliver(state.turn_id, 0).action == "next"
    assert runner.deliver(state.turn_id, 1).action == "none"
    final = rt.turns.load(state.turn_id)
    assert final.status == TurnStatus.COMPLETED
    assert "expired" in _tool_results(final)["rt_side_effect"].output["error"]


def test_rotated_secret_still_verifies_pending_approvals(prefix):
    old = get_runtime(make_settings(prefix, approval_secret=OLD_SECRET))
    state, _ = create_turn(old, "rt.approver", prompt="go", metadata={"prefix": prefix})
    StepRunner(old).deliver(state.turn_id, 0)
    [request] = [e for e in old.events.read(state.turn_id) if e.type == EventType.APPROVAL_REQUEST]
    data = request.data
    without_old = get_runtime(make_settings(prefix, approval_secret=NEW_SECRET))
    token = old.approvals.get(data["approval_id"]).token
    refused = decide_approval(without_old, data["approval_id"], token, True)
    assert not refused.accepted and refused.code == "invalid-token"
    rotated = get_runtime(make_settings(prefix, approval_secret=NEW_SECRET, approval_old_secrets=[OLD_SECRET]))
    assert decide_approval(rotated, data["approval_id"], token, True).accepted


def test_an_approved_mutation_is_stored_before_the_next_tool_starts(worker, client, prefix):
    """A mutation's result is durable as soon as it returns: a crash during a later tool cannot re-run it."""
    handle, requests = _park(client, prefix, agent="rt.mutation_then_observer")
    assert [r.data["tool"] for r in requests] == ["rt_side_effect", "rt_count_stored_results"]
    for request in requests:
        assert client.approve(request.data["approval_id"], True).wait(30)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED, result.error
    results = _tool_results(client.get(handle.turn_id))
    assert results["rt_side_effect"].output == {"label": "stored-at-once", "count": 1}
    assert results["rt_count_stored_results"].output == {"stored": 1}  # the mutation's, already in Redis


def _parked_and_released(client, rt, prefix, agent, metadata=None):
    """Park a turn on its gated call and wait until no worker holds it (nothing else writes it then)."""
    handle = client.submit(agent, prompt="go", metadata={"prefix": prefix, **(metadata or {})})
    request = next(e for e in handle.events(idle_timeout=60) if e.type == EventType.APPROVAL_REQUEST)
    eventually(lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL, what="the turn to park")
    eventually(lambda: not rt.redis.exists(rt.keys.lease(handle.turn_id)), what="the lease to be released")
    return handle, request


def test_an_approved_call_whose_stored_arguments_changed_is_not_run(worker, client, prefix, rt):
    """The approval binds the arguments' hash: a parked call altered after it was signed (here, in Redis)
    is refused on resume, whatever the reviewer approved."""
    handle, request = _parked_and_released(client, rt, prefix, "rt.approver")
    state = rt.turns.load(handle.turn_id)
    gated = next(c for c in state.parked.assistant.tool_calls if c.name == "rt_side_effect")
    gated.args = {"label": "tampered"}
    assert rt.turns.commit(state)

    assert client.approve(request.data["approval_id"], True).wait(30)
    assert handle.wait(timeout=60).status == TurnStatus.COMPLETED
    assert _side_effects(prefix, handle.turn_id, "tampered") == 0
    assert _side_effects(prefix, handle.turn_id, "gated") == 0
    refused = _tool_results(client.get(handle.turn_id))["rt_side_effect"]
    assert refused.is_error and refused.output["error"] == "approval does not match the call's arguments; not run"


@pytest.mark.parametrize(
    "tightening", [{"mutation_policy": "read-only"}, {"allowed_tools": ["pol_lookup"]}], ids=["read-only", "dropped"]
)
def test_an_approved_write_the_tenant_policy_now_forbids_is_not_run_and_says_why(
    worker, client, prefix, rt, tightening
):
    handle, request = _parked_and_released(client, rt, prefix, "pol.writer", {"tenant": "acme"})
    rt.policies.update("acme", "*", tightening)

    assert client.approve(request.data["approval_id"], True).wait(30)
    assert handle.wait(timeout=60).status == TurnStatus.COMPLETED
    refused = _tool_results(client.get(handle.turn_id))["pol_write"]
    assert refused.is_error and refused.output["error"] == (
        "approved, but pol_write is no longer allowed for this turn "
        "(a policy or the agent's tools changed since the approval); not run"
    )
    assert refused.output["do_not_retry"] is True


@pytest.mark.parametrize("decision", ["no", "false", 0, None])
def test_a_decision_that_is_not_a_bool_is_refused_and_sends_nothing(worker, client, prefix, rt, decision):
    """`approve(id, "no")` approved: the decision was sent as bool("no"), True. Anything but True or False is a
    TypeError now, before anything is sent; the approval stays pending and the gated call does not run."""
    handle, [request] = _park(client, prefix)
    approval_id = request.data["approval_id"]
    with pytest.raises(TypeError, match="approved must be True or False"):
        client.approve(approval_id, decision)
    assert rt.approvals.get(approval_id).status == "pending"
    assert _side_effects(prefix, handle.turn_id, "gated") == 0
    assert client.approve(approval_id, False, reason="no").wait(timeout=60)  # a real decision still works
    assert client.wait(handle.turn_id, timeout=60).status == TurnStatus.COMPLETED
    assert _side_effects(prefix, handle.turn_id, "gated") == 0
