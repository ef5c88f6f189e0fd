"""What every route shares: the producer `Client` (validation, storage, enqueueing — run in a worker
thread, since it is the library's sync code), the async Redis pool and the stream hub.

Every Redis connection the gateway opens carries the client name `stepq-gateway.<key prefix>`, so an operator
can count them (`CLIENT LIST`) and see that they do not grow with the number of open streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import redis.asyncio as aioredis
from fastapi import FastAPI
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff

from stepq.config.settings import Settings
from stepq.errors import ConfigurationError
from stepq.fleet.runtime import Runtime
from stepq.models import TurnState
from stepq.producer.client import Client
from stepq.producer.gateway.auth import Principal
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.health import RedisHealth
from stepq.producer.gateway.metrics import GatewayMetrics
from stepq.producer.gateway.streams import EventReader, StreamHub
from stepq.store.connection import BACKOFF_BASE_S, BACKOFF_CAP_S, CLUSTER_SCHEME, disconnect, parse_cluster_url

CLIENT_NAME = "stepq-gateway"
T = TypeVar("T")
COMMAND_RETRIES = 3  # retries of a command that failed on a dropped connection (the pub/sub hub reconnects itself)


def client_name(settings: Settings) -> str:
    """`stepq-gateway.<key prefix>`: the name every Redis connection of this gateway carries."""
    return f"{CLIENT_NAME}.{settings.key_prefix}"


def named_redis_url(url: str, name: str) -> str:
    """The same URL with `client_name` set, so every connection made from it is named in CLIENT LIST."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "client_name"] + [("client_name", name)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def gateway_settings(settings: Settings) -> Settings:
    """The gateway's settings: its Redis connections named; the broker URL left exactly as configured."""
    if not settings.redis_url:
        raise ConfigurationError(
            "stepq serve needs Redis: set STEPQ_REDIS_URL (e.g. redis://127.0.0.1:6379/0) and run `stepq worker`"
        )
    return settings.model_copy(
        update={
            "redis_url": named_redis_url(settings.redis_url, client_name(settings)),
            "broker_url": settings.effective_broker_url,
        }
    )


class Gateway:
    def __init__(
        self,
        settings: Settings,
        hub_factory: Callable[[aioredis.Redis], StreamHub] | None = None,
        *,
        embedded: bool = False,
    ) -> None:
        # embedded (`stepq demo --serve`): this process also runs the worker, so the in-process Redis
        # stand-in is the one the turns live in; otherwise the gateway needs a real Redis
        self.settings = settings if embedded and settings.embedded else gateway_settings(settings)
        self.client = Client(self.settings)
        self.metrics = GatewayMetrics()
        url = self.settings.redis_url
        if url is None:
            self.redis, self._pubsub_redis = _embedded_clients(self.client.runtime)
        elif url.startswith(CLUSTER_SCHEME):
            self.redis, self._pubsub_redis = _cluster_clients(url, self.settings.gateway_redis_pool)
        else:
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                decode_responses=True,
                max_connections=self.settings.gateway_redis_pool,
                timeout=30,
                # a pooled connection Redis dropped (a restart, CLIENT KILL, an idle timeout) fails on its
                # next use when the loop has not yet seen its close: retried on a new one, not a 503
                retry=AsyncRetry(ExponentialWithJitterBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), COMMAND_RETRIES),
            )
            self.redis = aioredis.Redis.from_pool(pool)  # owns the pool: closing the client disconnects it
            # the one pub/sub connection: a pool of its own, so it never competes with the commands
            self._pubsub_redis = aioredis.Redis.from_url(url, decode_responses=True, max_connections=1)
        self.hub = (hub_factory or StreamHub)(self._pubsub_redis)
        self.reader = EventReader(self.redis, self.runtime.keys)
        self.health = RedisHealth(self.redis, self.settings.redis_socket_timeout_s)

    @property
    def runtime(self) -> Runtime:
        return self.client.runtime

    @asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        await self.hub.start()
        await self.health.start()
        try:
            yield
        finally:
            await self.health.close()
            await self.hub.close()
            await self._pubsub_redis.aclose()
            await self.redis.aclose()
            if self.settings.redis_url is not None:  # embedded: the in-process worker still uses that client
                disconnect(self.runtime.redis)  # the sync side's (submit, load): the runtime is cached per process

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """The library's sync code (submit, load, cancel) in a worker thread, off the event loop."""
        return await anyio.to_thread.run_sync(lambda: fn(*args))

    async def turn_tenant(self, turn_id: str) -> str | None:
        """The tenant a turn belongs to, or None when there is no such turn (no history read)."""
        tenant, _ = await self.reader.owner_and_last_seq(turn_id)
        return tenant

    async def owned_turn(self, turn_id: str, principal: Principal) -> TurnState:
        state = await self.run_sync(self.runtime.turns.load, turn_id)
        if state is None or state.metadata.get("tenant") != principal.tenant:
            raise not_found_turn(turn_id)
        return state


def _cluster_clients(url: str, pool_size: int) -> tuple[aioredis.Redis, aioredis.Redis]:
    """Commands through the async cluster client; pub/sub on one plain connection to one node, since a
    cluster forwards every PUBLISH to all its nodes (a subscriber on any node hears every channel)."""
    target = parse_cluster_url(url)
    nodes = [ClusterNode(host, port) for host, port in target.nodes]
    commands = AsyncRedisCluster(
        startup_nodes=nodes, password=target.password, decode_responses=True, max_connections=pool_size
    )
    host, port = target.nodes[0]
    pubsub = aioredis.Redis(host=host, port=port, password=target.password, decode_responses=True, max_connections=1)
    return cast("aioredis.Redis", commands), pubsub


def _embedded_clients(runtime: Runtime) -> tuple[aioredis.Redis, aioredis.Redis]:
    """Async clients on the embedded mode's in-process Redis stand-in (the server the runtime's client uses)."""
    import fakeredis

    server = runtime.redis.connection_pool.connection_kwargs["server"]
    return (
        fakeredis.FakeAsyncRedis(server=server, decode_responses=True),
        fakeredis.FakeAsyncRedis(server=server, decode_responses=True),
    )


def not_found_turn(turn_id: str) -> GatewayError:
    return GatewayError(404, "not-found", f"no turn {turn_id!r} (unknown, expired after its TTL, or not yours)")
