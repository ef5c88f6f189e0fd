"""The gateway while Redis is down: a request it cannot serve is answered 503 `unavailable` with Retry-After at
once, not after the library's outage window. Real uvicorn, a private redis-server stopped and started for real.

STEPQ_REDIS_OUTAGE_S is long here: a 503 can come only from the gateway knowing Redis is down, never from the
library's retries running out (httpx's generous timeout would fail the test instead).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import eventually, make_settings
from tests.gateway_support import api_keys_setting, serve, submit
from tests.outage_helpers import RedisServer
from tests.test_cli_errors import closed_port

OUTAGE_S = 600.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    yield srv
    srv.close()


def _assert_unavailable_now(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    assert "127.0.0.1" not in response.text  # where Redis lives is for the gateway's log, not for callers


def _readyz_is(http: httpx.Client, status: int) -> bool:
    return http.get("/readyz").status_code == status


def test_a_submit_while_the_gateway_knows_redis_is_down_is_503_at_once(server: RedisServer, prefix: str) -> None:
    settings = make_settings(
        prefix, redis_url=server.url, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0, redis_outage_s=OUTAGE_S
    )
    with serve(settings) as gw, gw.client() as http:
        submit(http, "rt.basic", "before the outage", metadata={"prefix": prefix})  # Redis answered this gateway
        server.stop(save=True)
        eventually(lambda: _readyz_is(http, 503), timeout=60, what="/readyz to see Redis down")
        _assert_unavailable_now(http.post("/v1/turns", json={"agent": "rt.basic", "prompt": "during"}))
        _assert_unavailable_now(http.get("/v1/turns/turn_0123456789abcdef"))
        server.start()
        eventually(lambda: _readyz_is(http, 200), timeout=60, what="/readyz to see Redis back")
        submit(http, "rt.basic", "after the outage", metadata={"prefix": prefix})  # answered again at once


def test_a_gateway_whose_redis_never_answered_is_503_at_once(prefix: str) -> None:
    settings = make_settings(
        prefix,
        redis_url=f"redis://127.0.0.1:{closed_port()}/0",
        api_keys=api_keys_setting(),
        gateway_rate_limit_rpm=0,
        redis_outage_s=OUTAGE_S,
    )
    with serve(settings) as gw, gw.client() as http:
        _assert_unavailable_now(http.post("/v1/turns", json={"agent": "rt.basic", "prompt": "hi"}))
        _assert_unavailable_now(http.get("/readyz"))
