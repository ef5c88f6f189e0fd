"""StepEmitter's deferred writes when Redis fails under a timed flush."""

from __future__ import annotations

import socket

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stepq.engine.emitter import StepEmitter
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
    from stepq.models import EventType

    return EventType.STEP_FINISH, {"usage": {}, "finish_reason": "stop"}
