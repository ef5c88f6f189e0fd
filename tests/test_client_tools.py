"""Client-side tool calls end to end on a real Celery worker: park, resume once, refuse what is wrong."""

from __future__ import annotations

import threading
import time

import pytest

from stepq.errors import ToolResultsError, ToolResultsRefusal
from stepq.models import EventType, ToolResultMessage, TurnStatus
from tests.conftest import WorkerProcess, eventually

WAIT = 120


def _parked(client, agent, prefix, status=TurnStatus.AWAITING_TOOL_RESULTS):
    """Submit and follow the turn until it parks; returns its handle and the tool-results-request event."""
    handle = client.submit(agent, prompt="go", metadata={"prefix": prefix})
    request = None
    for event in handle.events(idle_timeout=WAIT):
        if event.type == EventType.TOOL_RESULTS_REQUEST:
            request = event
            break
        assert event.type != EventType.TURN_FINISH, event.data
    assert request is not None
    eventually(lambda: client.get(handle.turn_id).status == status, what=f"the turn to be {status}")
    return handle, request


def _stored(rt, turn_id):
    return rt.redis.hgetall(rt.keys.tool_results(turn_id))


def test_client_side_calls_park_the_turn_and_resume_supplies_them(worker, client, prefix, rt):
    handle, request = _parked(client, "ct.browser", prefix)
    state = client.get(handle.turn_id)
    assert state.status == TurnStatus.AWAITING_TOOL_RESULTS and state.parked.approvals == []
    assert request.data["calls"] == [
        {"tool_call_id": "call_0_1", "tool": "ct_pick_date", "args": {"question": "when?"}},
        {"tool_call_id": "call_0_2", "tool": "ct_geolocate", "args": {"precision": "city"}},
    ]
    assert request.data["expires_at"] == state.parked.client_calls[0].expires_at > state.updated_at
    # parked: no worker holds it; the server-side call of the same step already ran, the client ones did not
    eventually(lambda: not rt.redis.exists(rt.keys.lease(handle.turn_id)), what="the lease to be released")
    assert set(_stored(rt, handle.turn_id)) == {"call_0_0"}

    client.resume(handle.turn_id, {"call_0_1": "2026-12-24", "call_0_2": {"city": "Lyon"}})
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED, result.error
    # the model's next step read the caller's results as the tools' own, in call order
    assert result.text.startswith("saw: user:go | assistant:need the user call:ct_echo call:ct_pick_date")
    assert 'tool:ct_echo={"echo": "server"},ct_pick_date="2026-12-24",ct_geolocate={"city": "Lyon"}' in result.text
    events = list(handle.events())
    results = {e.data["id"]: e.data for e in events if e.type == EventType.TOOL_RESULT}
    assert results["call_0_1"]["output"] == "2026-12-24" and results["call_0_2"]["status"] == "ok"
    assert [e.type for e in events].count(EventType.TOOL_RESULTS_REQUEST) == 1
    # and the transcript it returns is paired: the form submit(messages=...) takes
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]


def test_unknown_missing_and_server_side_call_ids_are_refused_naming_them(worker, client, prefix, rt):
    handle, _ = _parked(client, "ct.browser", prefix)
    turn = handle.turn_id
    cases = [
        ({"call_0_1": "x", "call_0_2": {}, "call_9": 1}, ToolResultsRefusal.UNKNOWN_CALL, ["call_9"]),
        ({"call_0_1": "x", "call_0_0": "forged"}, ToolResultsRefusal.UNKNOWN_CALL, ["call_0_0"]),  # ran on the server
        ({"call_0_1": "x"}, ToolResultsRefusal.MISSING, ["call_0_2"]),
    ]
    for results, code, ids in cases:
        with pytest.raises(ToolResultsError) as err:
            client.resume(turn, results)
        assert err.value.code == code and err.value.call_ids == ids
        assert all(repr(i) in str(err.value) for i in ids) and "\n" not in str(err.value)
    for results, errors in [({"call_0_1": float("nan"), "call_0_2": 1}, ()), ({"call_0_1": 1}, ["call_0_2"])]:
        with pytest.raises(ToolResultsError) as err:
            client.resume(turn, results, errors=errors)
        assert err.value.code == ToolResultsRefusal.INVALID
    # nothing was stored and the turn still waits, untouched
    assert set(_stored(rt, turn)) == {"call_0_0"}
    assert client.get(turn).status == TurnStatus.AWAITING_TOOL_RESULTS

    client.resume(turn, {"call_0_1": "tomorrow", "call_0_2": "no access"}, errors=["call_0_2"])
    with pytest.raises(ToolResultsError) as err:  # answered: a second resume is refused, whatever it says
        client.resume(turn, {"call_0_1": "other", "call_0_2": "other"})
    assert err.value.code in (ToolResultsRefusal.ALREADY_ANSWERED, ToolResultsRefusal.NOT_WAITING)
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert 'ct_pick_date="tomorrow",ct_geolocate={"error": "no access", "status": "failed"}' in result.text
    with pytest.raises(ToolResultsError) as err:
        client.resume(turn, {"call_0_1": "late", "call_0_2": "late"})
    assert err.value.code == ToolResultsRefusal.NOT_WAITING


def test_concurrent_resumes_exactly_one_wins(worker, client, prefix, rt):
    handle, _ = _parked(client, "ct.browser", prefix)
    barrier = threading.Barrier(8)
    outcomes: dict[int, object] = {}

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            client.resume(handle.turn_id, {"call_0_1": f"date-{i}", "call_0_2": i})
            outcomes[i] = "accepted"
        except ToolResultsError as exc:
            outcomes[i] = exc.code

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, outcome in outcomes.items() if outcome == "accepted"]
    assert len(winners) == 1, outcomes
    assert {o for o in outcomes.values() if o != "accepted"} <= {
        ToolResultsRefusal.ALREADY_ANSWERED,
        ToolResultsRefusal.NOT_WAITING,
    }
    result = handle.wait(timeout=WAIT)
    (winner,) = winners
    assert f'ct_pick_date="date-{winner}",ct_geolocate={winner}' in result.text
    stored = client.get(handle.turn_id)
    results = [r for m in stored.messages if isinstance(m, ToolResultMessage) for r in m.results]
    assert [r.tool_call_id for r in results] == ["call_0_0", "call_0_1", "call_0_2"]


def test_a_client_call_with_bad_arguments_goes_back_to_the_model_without_parking(worker, client, prefix):
    result = client.submit("ct.bad_args", prompt="go", metadata={"prefix": prefix}).wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert "Invalid arguments for ct_geolocate" in result.text


def test_approval_and_client_call_in_one_step_wait_for_both(worker, client, prefix, rt):
    # results first: the turn still waits for the person
    handle, _ = _parked(client, "ct.mixed", prefix, status=TurnStatus.AWAITING_APPROVAL)
    [approval] = client.get(handle.turn_id).parked.approvals
    client.resume(handle.turn_id, {"call_0_1": "monday"})
    eventually(lambda: not rt.redis.exists(rt.keys.lease(handle.turn_id)), what="the resumed delivery to end")
    assert client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL
    assert client.approve(approval.approval_id, True).wait(30)
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert '"refunded_eur": 50.0' in result.text and 'ct_pick_date="monday"' in result.text

    # the decision first: the status then says that only tool results are awaited
    handle, _ = _parked(client, "ct.mixed", prefix, status=TurnStatus.AWAITING_APPROVAL)
    [approval] = client.get(handle.turn_id).parked.approvals
    assert client.approve(approval.approval_id, False, reason="no").wait(30)
    eventually(
        lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_TOOL_RESULTS,
        what="the status to move to awaiting_tool_results",
    )
    client.resume(handle.turn_id, {"call_0_1": "friday"})
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert "denied by reviewer: no" in result.text and 'ct_pick_date="friday"' in result.text


def test_cancelled_while_waiting_refuses_results(worker, client, prefix, rt):
    handle, _ = _parked(client, "ct.browser", prefix)
    client.cancel(handle.turn_id)
    assert handle.wait(timeout=WAIT).status == TurnStatus.CANCELLED
    with pytest.raises(ToolResultsError) as err:
        client.resume(handle.turn_id, {"call_0_1": "x", "call_0_2": "y"})
    assert err.value.code == ToolResultsRefusal.NOT_WAITING
    assert set(_stored(rt, handle.turn_id)) == {"call_0_0"}


def test_expired_calls_reach_the_model_and_a_lost_resume_is_swept(settings, client, prefix, rt):
    # with beat (the sweeper runs); a parked turn owed a resume counts as lost after STEPQ_QUEUED_GRACE_S
    worker = WorkerProcess(settings.model_copy(update={"queued_grace_s": 3.0}), "ct-beat")
    try:
        # nobody answers: at the expiry the sweeper resumes the step and the model reads that no result came
        expired = client.submit("ct.expiring", prompt="go", metadata={"prefix": prefix}).wait(timeout=WAIT)
        assert expired.status == TurnStatus.COMPLETED
        assert "expired before its caller answered it" in expired.text

        # results stored but the resume message never sent (a producer that died in between): swept
        handle, _ = _parked(client, "ct.browser", prefix)
        code, _ = rt.tool_results.submit_client(
            handle.turn_id,
            {
                "call_0_1": '{"tool_call_id": "call_0_1", "name": "ct_pick_date", "output": "d"}',
                "call_0_2": '{"tool_call_id": "call_0_2", "name": "ct_geolocate", "output": "g"}',
            },
            time.time(),
        )
        assert code == ""
        result = handle.wait(timeout=WAIT)
        assert result.status == TurnStatus.COMPLETED and 'ct_pick_date="d"' in result.text
    finally:
        worker.stop()
