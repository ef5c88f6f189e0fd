"""What the gateway knows of Redis right now, so a request that cannot succeed is answered at once.

A watcher pings Redis every PROBE_INTERVAL_S (and `/readyz` pings it too). While the last ping failed, every
authenticated request is answered 503 `unavailable` with `Retry-After` before it touches Redis: without this a
submit waited the whole outage window (STEPQ_REDIS_OUTAGE_S) in the library's retries before its 503, while
`/readyz` already knew. Only a failed ping (after the pool's own retries on a fresh connection) counts as
down, so a dropped connection or a slow command never turns requests away; the next answered ping ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from stepq.producer.gateway.errors import RETRY_AFTER, GatewayError

log = logging.getLogger("stepq.gateway")

PROBE_INTERVAL_S = 1.0  # how often the watcher pings (RETRY_AFTER tells a caller turned away to come back then)
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)


class RedisHealth:
    """Down from a failed ping until the next answered one; `refuse_while_down` turns requests away meanwhile."""

    def __init__(self, client: aioredis.Redis, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s  # a ping slower than the socket timeout is an unreachable Redis
        self.down_since: float | None = None
        self.last_error = ""
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    async def probe(self) -> bool:
        """Ping Redis once and record the answer; True when it answered."""
        try:
            # not asyncio.wait_for: on 3.11 it returns the ping's answer when the task is cancelled as the answer
            # arrives, and the watcher then never ends (the gateway's shutdown hung in `close`)
            async with asyncio.timeout(self.timeout_s):
                await self.client.ping()
        except UNREACHABLE as exc:
            self._saw_failure(exc)
            return False
        except RedisError as exc:  # an answer (a refusal, not an outage): Redis is there
            log.warning("Redis answered the health ping with %s", type(exc).__name__)
        self._saw_answer()
        return True

    def refuse_while_down(self) -> None:
        """503 `unavailable` with Retry-After, at once, while the last ping failed."""
        if self.down_since is None:
            return
        down_for = time.monotonic() - self.down_since
        raise GatewayError(
            503,
            "unavailable",
            f"Redis is not reachable (for {down_for:.0f} s: {self.last_error}); retry shortly",
            RETRY_AFTER,
        )

    async def start(self) -> None:
        self._stopping = asyncio.Event()  # a new one per start: an app's lifespan may run again, on another loop
        self._watcher = asyncio.create_task(self._watch(), name="stepq-redis-health")

    def stop(self) -> None:
        """End the watcher: cancelled, and told to stop, since the client may swallow a cancellation that lands
        inside its ping (redis-py's pool did, and the gateway's shutdown then hung in `close`)."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.cancel()

    async def close(self) -> None:
        self.stop()
        if self._watcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def _watch(self) -> None:
        while not self._stopping.is_set():  # the first ping at once: a Redis down at start is known at once
            await self.probe()
            with contextlib.suppress(TimeoutError):  # the probe's period, or the stop
                async with asyncio.timeout(PROBE_INTERVAL_S):
                    await self._stopping.wait()

    def _saw_failure(self, exc: BaseException) -> None:
        self.last_error = type(exc).__name__
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("Redis is not reachable (%s): answering 503 until it is", self.last_error)

    def _saw_answer(self) -> None:
        if self.down_since is not None:
            log.warning("Redis answers again after %.0f s", time.monotonic() - self.down_since)
        self.down_since = None
