"""StepEmitter's deferred writes when Redis fails under a timed flush."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stepq import io_loop
from stepq.engine.emitter import StepEmitter
from stepq.models import Delta, EventType, tool_input
from stepq.store.events import EventLog
from stepq.store.keys import Keys
from tests.conftest import closed_port, eventually


def _dead_redis() -> redis.Redis:
    """A client of a port nothing listens on, failing at once (no retries)."""
    return redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


def test_settle_raises_when_a_timed_flush_lost_a_write(prefix):
    """A write the flush timer could not send is not reported as stored: a mutation must not run after it."""
    dead = _dead_redis()
    emitter = StepEmitter(EventLog(dead, Keys(prefix), 1000), "turn_x", 0, window_s=0.01)
    emitter.defer_write(dead.register_script("return 1"), [f"{prefix}:k"], ["v"])
    eventually(emitter.idle, what="the flush timer to take the write")
    with pytest.raises(redis.ConnectionError):
        emitter.settle()


def test_settle_after_a_lost_event_only_is_fine(prefix):
    """Losing deltas in a timed flush (subscribers miss text) does not fail later writes."""
    dead = _dead_redis()
    emitter = StepEmitter(EventLog(dead, Keys(prefix), 1000), "turn_y", 0, window_s=0.01)
    emitter.defer(*_step_finish())
    eventually(emitter.idle, what="the flush timer to take the event")
    emitter.settle()  # nothing queued, nothing lost that was a write


def _step_finish():
    return EventType.STEP_FINISH, {"usage": {}, "finish_reason": "stop"}


def test_tool_input_coalesces_per_call_and_counts_as_no_answer_content(rt):
    """Pieces of one call's input share an event; another call's (or text) starts the next; the first piece after
    a quiet window goes at once, as text does. Every event names its call and tool."""
    turn_id = "turn_tool_input"
    emitter = StepEmitter(rt.events, turn_id, 0, window_s=120.0)  # no timed flush while the test runs
    pieces = ['{"q', 'uery"', ': "lo', 'ng text"}']
    for piece in pieces:
        emitter.emit(tool_input("c1", "lookup", piece))
    emitter.emit(tool_input("c2", "other", "{}"))
    emitter.emit(Delta("text", "done"))
    assert len(rt.events.read(turn_id)) == 1  # only the first piece went out yet: the rest wait for the window
    emitter.flush()

    events = [(e.type, e.data) for e in rt.events.read(turn_id)]
    assert events == [
        (EventType.TOOL_INPUT_DELTA, {"id": "c1", "name": "lookup", "text": '{"q'}),
        (EventType.TOOL_INPUT_DELTA, {"id": "c1", "name": "lookup", "text": 'uery": "long text"}'}),
        (EventType.TOOL_INPUT_DELTA, {"id": "c2", "name": "other", "text": "{}"}),
        (EventType.TEXT_DELTA, {"text": "done"}),
    ]
    assert emitter.emitted_tool_input and emitter.emitted_content  # the text made it content


def test_tool_input_alone_is_not_answer_content(rt):
    """A failure after streamed tool input only may retry as before (the retry resets the step, failure.py)."""
    emitter = StepEmitter(rt.events, "turn_tool_input_only", 0, window_s=0.0)
    emitter.emit(tool_input("c1", "lookup", "{}"))
    assert emitter.emitted_tool_input and not emitter.emitted_content
    assert emitter.text_parts == []


def test_streamed_tool_input_marks_the_step_as_emitted_for_crash_recovery(rt):
    """A worker that dies after streaming part of a call leaves the step marked, so the redelivered step
    publishes a step-reset and subscribers drop the partial call (as after partial text)."""
    turn_id = "turn_tool_input_crash"
    StepEmitter(rt.events, turn_id, 3, window_s=0.0).emit(tool_input("c1", "lookup", '{"q'))
    assert rt.redis.get(rt.keys.emitted(turn_id)) in ("3", b"3")


# --------------------------------------------------------------------------- deltas from the provider loop


def _on_loop(call: Callable[[], object]) -> object:
    """Run `call` on the provider loop's thread (where a pumped stream's reader emits), return its result."""

    async def run() -> object:
        return call()

    return asyncio.run_coroutine_threadsafe(run(), io_loop_running()).result(timeout=30)


def io_loop_running() -> asyncio.AbstractEventLoop:
    loop = io_loop.running()
    assert loop is not None
    return loop


def _texts(rt, turn_id: str) -> list[tuple[str, str]]:
    return [(e.type.value, e.data.get("text", "")) for e in rt.events.read(turn_id)]


def test_a_delta_from_the_provider_loop_never_waits_for_the_emitters_lock(rt):
    """The loop reads every stream of the process: a delta staged there returns at once even while the flush
    timer holds the step's lock (through another round trip); the timer writes it afterwards, coalesced."""
    turn_id = "turn_staged"
    emitter = StepEmitter(rt.events, turn_id, 0, window_s=0.01)
    with emitter._lock:  # as the timer holds it while a batch of writes goes out
        _on_loop(lambda: [emitter.emit(Delta("text", t)) for t in ("Hel", "lo")])
        assert emitter.emitted_content and emitter.text_parts == ["Hel", "lo"]
    eventually(lambda: _texts(rt, turn_id) == [("text-delta", "Hello")], what="the timer to write the staged deltas")


def test_staged_deltas_keep_their_order_kinds_and_calls_and_with_no_window_each_is_an_event(rt):
    turn_id = "turn_staged_order"
    emitter = StepEmitter(rt.events, turn_id, 0, window_s=0.0)
    deltas = [Delta("reasoning", "hm"), Delta("text", "a"), Delta("text", "b"), tool_input("c1", "look", '{"q"')]
    _on_loop(lambda: [emitter.emit(d) for d in deltas])
    emitter.flush()  # the step's own flush takes what is still staged
    # ... unless the flush timer took them first: its events-only write lets the step's lock go before its round
    # trip (the step's next write queues behind it in the group commit), so the read waits for the write to land
    eventually(lambda: len(rt.events.read(turn_id)) >= len(deltas), what="the staged deltas' write")
    assert _texts(rt, turn_id) == [
        ("reasoning-delta", "hm"),
        ("text-delta", "a"),
        ("text-delta", "b"),
        ("tool-input-delta", '{"q"'),
    ]
    assert emitter.emitted_tool_input


def test_a_failed_timed_write_stops_the_stream_that_staged_it(prefix):
    """The inline write of a delta raised when Redis was gone (the step then leaves the turn to the sweeper);
    a staged delta's write fails on the timer's thread, so the stream's next delta raises it instead."""
    emitter = StepEmitter(EventLog(_dead_redis(), Keys(prefix), 1000), "turn_z", 0, window_s=0.01)
    _on_loop(lambda: emitter.emit(Delta("text", "lost")))
    eventually(lambda: emitter._stream_failure is not None, what="the timer's write to fail")
    with pytest.raises(redis.ConnectionError):
        _on_loop(lambda: emitter.emit(Delta("text", "next")))
