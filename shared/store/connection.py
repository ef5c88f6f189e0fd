"""Redis clients: a real server from `STEPQ_REDIS_URL`, or one in-process fakeredis for the embedded mode."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import redis

from stepq.config import Settings
from stepq.errors import MissingExtraError

if TYPE_CHECKING:
    import fakeredis

_lock = threading.Lock()
_clients: dict[str, redis.Redis] = {}
_fake_server: fakeredis.FakeServer | None = None
# redis-py 8 caps a pool at 100 connections and raises MaxConnectionsError past it. A worker holds up to one per
# step thread (plus pub/sub followers), so `--concurrency` above ~100 failed steps. Redis's own default maxclients;
# `?max_connections=N` in STEPQ_REDIS_URL overrides it.
MAX_CONNECTIONS = 10_000


def get_redis(settings: Settings) -> redis.Redis:
    """One shared, thread-safe client per URL (redis-py pools connections internally)."""
    key = settings.redis_url or "embedded"
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _make_client(settings)
            _clients[key] = client
        return client


def _make_client(settings: Settings) -> redis.Redis:
    global _fake_server
    if settings.redis_url:
        return redis.Redis.from_url(
            settings.redis_url, decode_responses=True, health_check_interval=30, max_connections=MAX_CONNECTIONS
        )
    try:
        import fakeredis
    except ImportError:  # a lean install for real Redis only
        raise MissingExtraError("embedded mode (STEPQ_REDIS_URL unset)", "embedded") from None
    if _fake_server is None:
        _fake_server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=_fake_server, decode_responses=True)
