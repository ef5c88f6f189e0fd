"""Retry only before the first chunk, through a real Celery worker."""

from __future__ import annotations

import pytest

from stepq.engine.retry import backoff_countdown
from stepq.models import EventType, TurnStatus


def _events(handle):
    return list(handle.events(idle_timeout=60))


def test_429_with_retry_after_is_retried_with_that_countdown(worker, client):
    handle = client.submit("rt.rate_limited", prompt="go")
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    assert result.text == "ok after retry"
    retries = [e for e in _events(handle) if e.type == EventType.STEP_RETRY]
    assert len(retries) == 1
    assert retries[0].data["countdown"] == 1.0
    assert retries[0].data["status"] == 429
    assert result.trace.steps[0].retries == 1


def test_in_stream_error_before_content_is_retried(worker, client):
    handle = client.submit("rt.in_stream_error", prompt="go")
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    events = _events(handle)
    retries = [e for e in events if e.type == EventType.STEP_RETRY]
    assert len(retries) == 1 and retries[0].data["code"] == "overloaded_error"
    # nothing from the failed attempt reached subscribers before the retry
    first_retry = retries[0].seq
    assert not [e for e in events if e.seq < first_retry and e.type == EventType.TEXT_DELTA]


def test_error_after_first_chunk_is_not_retried(worker, client):
    handle = client.submit("rt.error_after_content", prompt="go")
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.FAILED
    events = _events(handle)
    types = [e.type for e in events]
    assert EventType.STEP_RETRY not in types
    partial = "".join(e.data["text"] for e in events if e.type == EventType.TEXT_DELTA)
    assert partial and "partial answer that breaks".startswith(partial)
    assert len(partial) < len("partial answer that breaks")
    errors = [e for e in events if e.type == EventType.ERROR]
    assert errors and "overloaded mid-stream" in errors[0].data["message"]
    assert result.text == partial
    assert "after content" in (result.error or "")


def test_attempts_exhausted_fails_with_last_error(settings, worker, client):
    handle = client.submit("rt.always_failing", prompt="go")
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.FAILED
    assert "unavailable" in (result.error or "")
    assert f"{settings.retry_max_attempts} attempts" in (result.error or "")
    retries = [e for e in _events(handle) if e.type == EventType.STEP_RETRY]
    assert [e.data["attempt"] for e in retries] == list(range(1, settings.retry_max_attempts))
    for e in retries:  # no retry-after: full jitter within the capped exponential ceiling
        ceiling = min(settings.retry_cap_s, settings.retry_base_s * 2 ** (e.data["attempt"] - 1))
        assert 0 <= e.data["countdown"] <= ceiling


def test_retry_after_emission_resets_then_retries(worker, client):
    handle = client.submit("rt.reset_on_error", prompt="go")
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    events = _events(handle)
    types = [e.type for e in events]
    reset = types.index(EventType.STEP_RESET)
    assert types.index(EventType.STEP_RETRY) > reset
    assert EventType.TEXT_DELTA in types[:reset]  # the partial output that subscribers must drop
    after = "".join(e.data["text"] for e in events[reset:] if e.type == EventType.TEXT_DELTA)
    assert after == result.text == "partial answer that breaks"


@pytest.mark.parametrize("attempt", [0, 1, 3, 10])
def test_full_jitter_stays_within_capped_ceiling(attempt):
    import random

    rng = random.Random(attempt)
    values = [backoff_countdown(attempt, 1.0, 30.0, rng) for _ in range(200)]
    ceiling = min(30.0, 2**attempt)
    assert all(0 <= v <= ceiling for v in values)
    assert max(values) > ceiling / 2  # it is jittered over the whole range, not a constant


def test_a_batch_turns_retry_stays_on_the_batch_queue(settings):
    """The retry of a batch-priority step goes back to the batch queue, not ahead of chats on the interactive
    one: here only a batch-queue worker runs, so the turn ends only if its retry lands there."""
    from celery.contrib.testing.worker import start_worker

    from stepq.fleet.protocol import queue_for
    from stepq.producer.client import Client
    from stepq.workers.app import create_app

    client = Client(settings)
    app = create_app(settings)
    batch_queue = [queue_for(settings, "batch")]
    with start_worker(
        app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING", queues=batch_queue
    ):
        handle = client.submit("rt.rate_limited", prompt="go", priority="batch")
        result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED and result.trace.steps[0].retries == 1
