"""Events: gap-free seq, resumable subscriptions, delta coalescing, log TTL, cancellation."""

from __future__ import annotations

import threading
import time

import pytest
import redis.client

from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, FinishReason, TurnStatus
from tests.agents_engine import CHATTY_TEXT, drive, executions, gate_key, start
from tests.conftest import make_settings


def _text(events) -> str:
    return "".join(e.data["text"] for e in events if e.type == EventType.TEXT_DELTA)


def test_seq_is_strictly_increasing_and_gap_free(rt, prefix):
    turn_id = start(rt, "eng.usage_trace", prefix)  # tools, a retry, several steps
    drive(rt, turn_id)
    events = rt.events.read(turn_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert rt.events.last_seq(turn_id) == len(events)
    assert all(e.turn_id == turn_id for e in events)
    types = [e.type for e in events]
    assert types[0] == EventType.TURN_START and types[-1] == EventType.TURN_FINISH
    for kind in (EventType.STEP_START, EventType.STEP_RETRY, EventType.TOOL_CALL, EventType.TOOL_RESULT):
        assert kind in types
    # steps never go backwards in the log
    steps = [e.step for e in events]
    assert steps == sorted(steps)


def test_seq_is_per_turn_under_concurrent_turns(worker, client, prefix):
    handles = [client.submit("eng.simple", prompt=f"hi {i}", metadata={"prefix": prefix}) for i in range(4)]
    for handle in handles:
        assert handle.wait(timeout=120).status == TurnStatus.COMPLETED
    for handle in handles:
        events = list(handle.events(idle_timeout=120))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert {e.turn_id for e in events} == {handle.turn_id}
        assert events[-1].type == EventType.TURN_FINISH


def test_resumed_subscription_sees_every_event_exactly_once(worker, client, prefix):
    """Read a live turn up to its tool call (the tool blocks on a gate), disconnect, let the turn go on,
    then resume from the last seq: first part + resumed part == the full log, nothing twice."""
    handle = client.submit("eng.gated", prompt="go", metadata={"prefix": prefix})
    first = []
    stream = client.events(handle.turn_id, idle_timeout=120)
    for event in stream:
        first.append(event)
        if event.type == EventType.TOOL_CALL:
            break
    stream.close()  # disconnect while the turn is live (its tool is blocked on the gate)
    assert not handle.get().status.terminal
    assert EventType.TEXT_DELTA in {e.type for e in first}

    client.runtime.redis.rpush(gate_key(prefix, "g"), "open")
    resumed = list(client.events(handle.turn_id, after=first[-1].seq, idle_timeout=120))
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED

    full = client.runtime.events.read(handle.turn_id)
    seen = first + resumed
    assert [e.seq for e in seen] == [e.seq for e in full]
    assert [e.model_dump() for e in seen] == [e.model_dump() for e in full]
    assert resumed[-1].type == EventType.TURN_FINISH
    assert _text(e for e in resumed if e.step == 1) == "after the gate opened, the rest of the answer"


def test_a_follow_keeps_what_was_written_just_before_the_turn_was_seen_finished(rt, prefix):
    """On a quiet channel the follow asks whether the turn finished, then reads the log: an event written
    between the two (the turn ending right then; a loaded machine hit it) is still delivered, not dropped."""
    turn_id = start(rt, "eng.simple", prefix)
    first = rt.events.publish(turn_id, EventType.TEXT_DELTA, 0, {"text": "before"})
    late: list[int] = []

    def finished() -> bool:
        if not late:  # the turn's last event lands as the follow asks, after its last look at the log
            late.append(rt.events.publish(turn_id, EventType.TEXT_DELTA, 0, {"text": "just before the end"}))
        return True

    seen = list(rt.events.follow(turn_id, after=first, idle_timeout=60, is_finished=finished))
    assert [e.seq for e in seen] == late
    assert [e.data["text"] for e in seen] == ["just before the end"]


def test_resume_from_any_cursor_after_the_turn_ended(rt, prefix, client):
    turn_id = start(rt, "eng.simple", prefix)
    drive(rt, turn_id)
    full = rt.events.read(turn_id)
    for cursor in (0, 1, len(full) // 2, len(full) - 1):
        replay = list(client.events(turn_id, after=cursor, idle_timeout=120))
        assert [e.seq for e in replay] == list(range(cursor + 1, len(full) + 1))


@pytest.mark.parametrize(("window_ms", "coalesced"), [(200.0, True), (0.0, False)])
def test_coalescing_reduces_delta_events_but_keeps_the_text(prefix, window_ms, coalesced):
    rt = get_runtime(make_settings(prefix, coalesce_window_ms=window_ms))
    turn_id = start(rt, "eng.chatty", prefix)
    state = drive(rt, turn_id)
    assert state.text == CHATTY_TEXT
    deltas = [e for e in rt.events.read(turn_id) if e.type == EventType.TEXT_DELTA]
    assert _text(deltas) == CHATTY_TEXT
    script_deltas = len(CHATTY_TEXT) // 3  # delta_chars=3
    if coalesced:
        assert len(deltas) < script_deltas
    else:
        assert len(deltas) == script_deltas  # window 0: every delta is its own event


def test_event_log_gets_a_ttl_when_the_turn_ends(prefix):
    ttl = 120
    rt = get_runtime(make_settings(prefix, event_ttl_s=ttl))
    turn_id = start(rt, "eng.simple", prefix)
    assert rt.redis.ttl(rt.keys.events(turn_id)) == -1  # a live turn's log does not expire
    drive(rt, turn_id)
    assert rt.events.read(turn_id)[-1].type == EventType.TURN_FINISH  # written after the terminal commit
    for key in (rt.keys.events(turn_id), rt.keys.seq(turn_id), rt.keys.turn(turn_id), rt.keys.tool_results(turn_id)):
        remaining = rt.redis.ttl(key)
        assert 0 < remaining <= ttl, key
    owned = [k for k in rt.redis.scan_iter(match=f"{prefix}:*{turn_id}*", count=1000) if ":eng-calls:" not in k]
    assert owned
    assert all(0 < rt.redis.ttl(k) <= ttl for k in owned), {k: rt.redis.ttl(k) for k in owned}


def test_event_log_ttl_after_failure_and_cancel(prefix):
    ttl = 120
    rt = get_runtime(make_settings(prefix, event_ttl_s=ttl))
    failed = start(rt, "eng.object_model_bad", prefix)
    assert drive(rt, failed).status == TurnStatus.FAILED
    cancelled = start(rt, "eng.simple", prefix)
    rt.turns.request_cancel(cancelled)
    assert drive(rt, cancelled).status == TurnStatus.CANCELLED
    for turn_id in (failed, cancelled):
        assert 0 < rt.redis.ttl(rt.keys.events(turn_id)) <= ttl


def test_cancel_before_the_first_step(rt, prefix):
    turn_id = start(rt, "eng.simple", prefix)
    rt.turns.request_cancel(turn_id)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.CANCELLED
    assert state.finish_reason == FinishReason.CANCELLED
    assert state.trace.steps == []
    finish = rt.events.read(turn_id)[-1]
    assert finish.type == EventType.TURN_FINISH and finish.data["status"] == "cancelled"


def test_cancel_a_parked_turn(rt, prefix):
    turn_id = start(rt, "eng.confirm", prefix)
    parked = drive(rt, turn_id)
    assert parked.status == TurnStatus.AWAITING_APPROVAL
    rt.turns.request_cancel(turn_id)
    state = drive_from(rt, turn_id, parked.step)
    assert state.status == TurnStatus.CANCELLED
    assert state.finish_reason == FinishReason.CANCELLED
    assert executions(prefix, turn_id, "eng_write") == 0
    assert rt.turns.indexes.score("awaiting", turn_id) is None  # the sweeper no longer tracks it


def drive_from(rt, turn_id: str, step: int):
    from stepq.engine.runner import StepRunner

    assert StepRunner(rt).deliver(turn_id, step).action == "none"
    return rt.turns.load(turn_id)


def test_cancel_stops_a_streaming_step_between_deltas(worker, client, prefix):
    handle = client.submit("eng.slow", prompt="go", metadata={"prefix": prefix})
    stream = client.events(handle.turn_id, idle_timeout=120)
    for event in stream:
        if event.type == EventType.TEXT_DELTA:
            break
    client.cancel(handle.turn_id)
    rest = list(stream)
    result = handle.wait(timeout=120)

    assert result.status == TurnStatus.CANCELLED
    assert result.finish_reason == FinishReason.CANCELLED
    assert rest[-1].type == EventType.TURN_FINISH and rest[-1].data["status"] == "cancelled"
    streamed = _text(client.runtime.events.read(handle.turn_id))
    assert 0 < len(streamed) < 2000  # the script has 1000 deltas of 2 chars; the step stopped early
    assert streamed == "x" * len(streamed)
    assert result.text == streamed  # the partial answer is kept


@pytest.mark.parametrize("after", [-5, "3", 1.5, True, 10_000])
def test_a_bad_cursor_is_a_clear_error_not_a_redis_error(rt, prefix, client, after):
    """Negative, not an integer, or past the end: EventCursorError naming the cursor, before anything runs."""
    from stepq.errors import EventCursorError

    turn_id = start(rt, "eng.simple", prefix)
    drive(rt, turn_id)
    with pytest.raises(EventCursorError, match="after="):
        client.events(turn_id, after=after)
    with pytest.raises(EventCursorError):
        rt.events.follow(turn_id, after=after)
    last = rt.events.last_seq(turn_id)
    assert [e.seq for e in client.events(turn_id, after=last)] == []  # the end itself is a valid cursor


def test_a_follow_waits_a_quiet_tick_for_the_turn_finish_that_follows_the_commit(rt, prefix):
    """A turn is stored as ended (its commit) one round trip before its `turn-finish` event is written: a quiet
    tick that falls in between sees it ended with nothing new, and must not end the follow without that event."""
    turn_id = start(rt, "eng.simple", prefix)
    first = rt.events.publish(turn_id, EventType.TEXT_DELTA, 0, {"text": "the answer"})
    asked: list[int] = []

    def finished() -> bool:
        asked.append(len(asked))
        if len(asked) == 2:  # the writer is a tick late: its turn-finish lands only now
            rt.events.publish(turn_id, EventType.TURN_FINISH, 0, {"status": "completed"})
        return True

    seen = list(rt.events.follow(turn_id, after=first, idle_timeout=60, is_finished=finished))
    assert [e.type for e in seen] == [EventType.TURN_FINISH]


def _told(rt, pubsub, channel: str) -> list[str]:
    """What `channel` has carried so far: every message up to a sentinel this test publishes after them."""
    rt.redis.publish(channel, "sentinel")
    told: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=1)  # None also for the subscribe confirmation, which it skips
        if message is None:
            continue
        if message["data"] == "sentinel":
            return told
        told.append(message["data"])
    raise AssertionError(f"the sentinel never came back on {channel}")


@pytest.mark.parametrize(
    "agent_id",
    [
        "eng.simple",  # nothing waits on its end: the commit itself writes turn-finish
        "otel_t.hooked",  # its hooks run between the commit and turn-finish: the event is written after them
    ],
)
def test_a_turns_finished_channel_is_told_once_with_the_seq_of_its_turn_finish(rt, prefix, agent_id):
    turn_id = start(rt, agent_id, prefix)
    pubsub = rt.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(rt.keys.finished(turn_id))
    try:
        assert drive(rt, turn_id).status == TurnStatus.COMPLETED
        told = _told(rt, pubsub, rt.keys.finished(turn_id))
    finally:
        pubsub.close()
    events = rt.events.read(turn_id)
    assert events[-1].type == EventType.TURN_FINISH and len(events) > 3
    assert told == [str(events[-1].seq)]


def test_a_waiting_client_listens_for_the_turns_end_not_for_its_events(worker, client, prefix, monkeypatch):
    """`Client.wait` subscribes to the turn's `finished` channel, not to its event channel: a streamed,
    multi-step turn wakes it at most once (its end; a quiet second's re-read may see the end first), where
    following the event channel would wake it for every delta and tool event."""
    woken: list[object] = []
    waiter_thread: list[threading.Thread] = []
    read = redis.client.PubSub.get_message

    def counted(self, *args, **kwargs):
        message = read(self, *args, **kwargs)
        if message is not None and threading.current_thread() in waiter_thread:
            woken.append(message["channel"])
        return message

    monkeypatch.setattr(redis.client.PubSub, "get_message", counted)
    handle = client.submit("eng.gated", prompt="go", metadata={"prefix": prefix})  # parks on its tool's gate
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(handle.wait(timeout=120)), daemon=True)
    waiter_thread.append(waiter)
    waiter.start()
    keys, redis_ = client.runtime.keys, client.runtime.redis
    finished, channel = keys.finished(handle.turn_id), keys.channel(handle.turn_id)
    deadline = time.monotonic() + 120
    while not redis_.pubsub_numsub(finished)[0][1]:  # until the waiter has subscribed (polled)
        assert waiter.is_alive() and time.monotonic() < deadline, results
        time.sleep(0.01)
    assert redis_.pubsub_numsub(channel)[0][1] == 0  # nobody follows the turn's events
    assert not handle.get().status.terminal  # the turn waits on its tool's gate
    redis_.rpush(gate_key(prefix, "g"), "open")  # the rest: a tool result, a streamed step
    waiter.join(timeout=120)
    assert not waiter.is_alive() and results[0].status == TurnStatus.COMPLETED
    events = client.runtime.events.read(handle.turn_id)
    gate = next(e.seq for e in events if e.type == EventType.TOOL_CALL)
    after_gate = [e.type for e in events if e.seq > gate]  # written while the waiter was subscribed
    assert EventType.TEXT_DELTA in after_gate and len(after_gate) >= 5, after_gate
    assert woken in ([finished], [])
