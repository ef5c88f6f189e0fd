"""Worker heartbeats in Redis: what `stepq status` lists as live workers.

Why not `celery inspect ping`: it broadcasts to every worker over the broker and always waits its full
timeout, it answers only through Celery's remote control (off or filtered in some deployments), and it
cannot say which key prefix a worker serves. A heartbeat is one pipelined write per worker every
`HEARTBEAT_INTERVAL_S` under the worker's own prefix, and reading it is instant and broker-independent.

Layout: a ZSET of name -> last beat and a HASH of name -> JSON (`Keys.workers`, `Keys.workers_info`).

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from stepq.store.keys import Keys

HEARTBEAT_INTERVAL_S = 10.0
LIVE_WITHIN_S = 3 * HEARTBEAT_INTERVAL_S  # a worker missing three beats is presumed gone
FORGET_AFTER_S = 3600.0  # entries of workers killed without a goodbye are pruned after this

log = logging.getLogger("stepq.heartbeat")


def beat(client: redis.Redis, prefix: str, name: str, info: dict[str, Any], now: float | None = None) -> None:
    now = time.time() if now is None else now
    keys = Keys(prefix)
    stale: list[Any] = client.zrangebyscore(keys.workers, "-inf", now - FORGET_AFTER_S)
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.workers, {name: now})
    pipe.hset(keys.workers_info, name, json.dumps({**info, "beat_at": round(now, 3)}))
    if stale:
        pipe.zrem(keys.workers, *stale)
        pipe.hdel(keys.workers_info, *stale)
    pipe.execute()


def forget(client: redis.Redis, prefix: str, name: str) -> None:
    keys = Keys(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.zrem(keys.workers, name)
    pipe.hdel(keys.workers_info, name)
    pipe.execute()


def live_workers(client: redis.Redis, prefix: str, now: float | None = None) -> list[dict[str, Any]]:
    """Workers that beat within LIVE_WITHIN_S, each with its info and `seconds_ago`."""
    now = time.time() if now is None else now
    keys = Keys(prefix)
    entries: list[tuple[Any, float]] = client.zrangebyscore(  # type: ignore[assignment]
        keys.workers, now - LIVE_WITHIN_S, "+inf", withscores=True
    )
    if not entries:
        return []
    names = [n.decode() if isinstance(n, bytes) else str(n) for n, _ in entries]
    infos = client.hmget(keys.workers_info, names)
    found = []
    for (name, (_, score)), raw in zip(zip(names, entries, strict=True), infos, strict=True):
        info = json.loads(raw) if raw else {}
        found.append({**info, "name": name, "seconds_ago": round(max(0.0, now - score), 1)})
    return found


class Heartbeat:
    """A daemon thread that beats until stopped (a failed beat is logged, never fatal)."""

    def __init__(
        self, client: redis.Redis, prefix: str, name: str, info: Callable[[], dict[str, Any]], interval_s: float
    ) -> None:
        self.client, self.prefix, self.name, self.info, self.interval_s = client, prefix, name, info, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepq-heartbeat", daemon=True)

    def start(self) -> None:
        self._beat()  # visible at once, not one interval later
        self._thread.start()

    def _beat(self) -> None:
        try:
            beat(self.client, self.prefix, self.name, self.info())
        except Exception as exc:
            log.warning("heartbeat failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        try:
            forget(self.client, self.prefix, self.name)
        except Exception as exc:
            log.warning("could not remove the heartbeat of %s: %s", self.name, exc)
