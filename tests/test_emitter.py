"""StepEmitter's deferred writes when Redis fails under a timed flush."""

from __future__ import annotations

import socket

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stepq.engine.emitter import StepEmitter
from stepq.models import Delta, EventType, tool_input
from stepq.store.events import EventLog
from stepq.store.keys import Keys
from tests.conftest import eventually


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dead_redis() -> redis.Redis:
    """A client of a port nothing listens on, failing at once (no retries)."""
    return redis.Redis(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


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
