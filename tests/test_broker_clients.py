"""The broker side of a step's cost. kombu's Redis channel reuses one client per pool (stepq.fleet.broker_clients):
a send or an ack no longer builds a `redis.Redis` (and its callback table) each time, and a channel whose pool
was dropped builds anew. A run_step message carries its display headers, so Celery does not saferepr them."""

from __future__ import annotations

import base64
import json
from typing import Any

import celery.app.amqp
import pytest
import redis

from stepq.fleet.protocol import RUN_STEP, run_step_message
from stepq.producer.client import Client
from tests.conftest import REDIS_URL

SENDS = 20


def _queued(settings_queue: str, prefix: str) -> int:
    """Messages in the run_step queue's Redis lists (kombu names them under the broker's key prefix)."""
    r = redis.Redis.from_url(REDIS_URL)
    try:
        keys = r.scan_iter(match=f"{prefix}:*{settings_queue}*", count=1000)
        return sum(int(r.llen(key)) for key in keys if r.type(key) == b"list")
    finally:
        r.close()


def test_sends_build_no_redis_client_after_the_first(
    client: Client, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = client.celery
    queue = client.settings.queue
    app.send_task(RUN_STEP, args=["warm-up", 0], queue=queue)  # the channel, its pool and its client
    built: list[int] = []
    original = redis.Redis.__init__

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    for n in range(SENDS):
        app.send_task(RUN_STEP, args=[f"turn-{n}", 0], queue=queue)
    monkeypatch.undo()
    assert len(built) == 0
    assert _queued(queue, prefix) == SENDS + 1  # every message went out


def test_a_channel_whose_pool_was_dropped_builds_a_client_on_the_new_pool(client: Client) -> None:
    with client.celery.connection_for_write() as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as again:
            assert again is first
        channel._pool = None  # what kombu does to a channel on a disconnect
        with channel.conn_or_acquire() as rebuilt:
            assert rebuilt is not first
            assert rebuilt.connection_pool is channel.pool
            assert rebuilt.ping()


def test_a_run_step_message_carries_its_argsrepr_so_celery_does_not_saferepr_it(
    client: Client, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, queue = client.celery, client.settings.queue
    reprs: list[object] = []
    original = celery.app.amqp.saferepr

    def counting(value: object, *args: Any, **kwargs: Any) -> str:
        reprs.append(value)
        return original(value, *args, **kwargs)

    monkeypatch.setattr(celery.app.amqp, "saferepr", counting)
    app.send_task(RUN_STEP, queue=queue, **run_step_message("turn-x", 3, attempt=2))
    monkeypatch.undo()
    assert reprs == []
    r = redis.Redis.from_url(REDIS_URL)
    try:
        [key] = [k for k in r.scan_iter(match=f"{prefix}:*{queue}*", count=1000) if r.type(k) == b"list"]
        message = json.loads(r.lpop(key))
    finally:
        r.close()
    headers = message["headers"]
    assert (headers["argsrepr"], headers["kwargsrepr"]) == ("['turn-x', 3]", "{'attempt': 2}")
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == (["turn-x", 3], {"attempt": 2})
