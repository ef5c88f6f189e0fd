"""The gateway shuts down cleanly: its lifespan ends (whatever its Redis watcher was doing) and leaves no
connection to Redis open. Real uvicorn, real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from stepq.producer.gateway.health import RedisHealth
from stepq.producer.gateway.service import Gateway, client_name, gateway_settings
from tests.conftest import make_settings
from tests.gateway_support import api_keys_setting, serve

HANG_GUARD_S = 60  # fails a hung shutdown instead of hanging the suite; nothing waits on it otherwise


@pytest.fixture
def gw_settings(prefix: str) -> Any:
    return make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)


def _named(rt: Any, name: str) -> list[dict[str, Any]]:
    return [c for c in rt.redis.client_list() if c.get("name") == name]


def test_a_stopped_gateway_leaves_no_connection_to_redis(gw_settings, rt):
    """The async command pool and pub/sub connection and the sync client's (submit, load) are closed, not only
    the clients over them (a client given a pool does not own it)."""
    with serve(gw_settings) as served:  # uvicorn on uvloop, whose close also ends the loop's sockets
        name = client_name(served.settings)
        with served.client() as http:
            assert http.get("/readyz").json() == {"status": "ready"}
            assert http.get("/v1/turns/turn_nope").status_code == 404  # the sync client's load
        assert _named(rt, name)
    assert _named(rt, name) == []

    gateway = Gateway(gw_settings)  # its lifespan on a plain asyncio loop, as an app that mounts it runs it

    async def lifespan() -> None:
        async with gateway.lifespan(FastAPI()):
            assert await gateway.redis.ping()
            assert _named(rt, name)

    asyncio.run(lifespan())
    assert _named(rt, name) == []


class AnswersAsTheGatewayStops(aioredis.Redis):
    """A real client whose ping, once Redis has answered it, stops the health watcher: a shutdown arriving
    just as the answer does (`asyncio.wait_for` then returned the answer and dropped the cancellation)."""

    health: RedisHealth

    async def ping(self, **kwargs: Any) -> Any:
        answer = await super().ping(**kwargs)
        self.health.stop()
        return answer


def test_the_health_watcher_ends_when_stopped_as_redis_answers(gw_settings):
    url = gateway_settings(gw_settings).redis_url

    async def stopped_as_answered() -> None:
        client = AnswersAsTheGatewayStops.from_url(url)
        health = client.health = RedisHealth(client, timeout_s=30)
        try:
            await health.start()
            [watcher] = [t for t in asyncio.all_tasks() if t.get_name() == "stepq-redis-health"]
            async with asyncio.timeout(HANG_GUARD_S):
                await asyncio.wait({watcher})
            assert watcher.cancelled() or watcher.exception() is None  # ended, not crashed
            assert not health.down
        finally:
            await client.aclose()

    asyncio.run(stopped_as_answered())
