"""One Redis client per kombu channel instead of one per broker call: a per-message CPU cost cut from every step.

kombu's Redis transport (5.7.0) builds a new `redis.Redis` on the channel's pool for every publish, ack and
queue-size read (`Channel.conn_or_acquire` -> `_create_client`), and redis-py fills a ~170-entry case-insensitive
callback table per client: 65-85 us of CPU each time, twice per step on a worker (the next step's publish and
this step's ack) and once per submit on a producer. A client holds no connection of its own (each command takes
one from the pool and gives it back), so one client per channel and pool is as safe to share between threads as
the pool is; a channel whose pool is replaced (kombu drops it on a disconnect) builds a new one on the new pool.
Workers (`stepq.workers.app.create_app`) and producers (`Client.celery`) install it before their first send.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_CACHED = "_stepq_sync_client"  # on the channel instance: (the pool it was built on, the client)
_installed = False


def install() -> None:
    """Patch `kombu.transport.redis.Channel.conn_or_acquire` once per process (idempotent)."""
    global _installed
    if _installed:
        return
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # the Redis transport needs redis-py; without it there is nothing to patch
        return
    kombu_redis.Channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign]
    _installed = True


@contextmanager
def _conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
    """kombu's `Channel.conn_or_acquire`, reusing one client per channel and pool instead of one per call."""
    if client:
        yield client
        return
    pool = self.pool
    cached = self.__dict__.get(_CACHED)
    if cached is None or cached[0] is not pool:
        cached = (pool, self._create_client())
        self.__dict__[_CACHED] = cached
    yield cached[1]
