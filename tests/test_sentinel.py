"""Redis behind Sentinel: `STEPQ_REDIS_URL=redis+sentinel://…` for state and (derived) the broker; a
failover with steps in flight is waited out. Real redis-server master, replica and Sentinel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepq.config.settings import Settings
from stepq.errors import ConfigurationError
from stepq.fleet.protocol import celery_config
from stepq.models import EventType, TurnStatus
from stepq.store.connection import parse_sentinel_url
from tests.conftest import WorkerProcess, make_settings
from tests.outage_helpers import SentinelSetup


@pytest.fixture
def sentinel() -> Iterator[SentinelSetup]:
    setup = SentinelSetup()
    yield setup
    setup.close()


def test_sentinel_url_gives_the_broker_the_same_sentinels() -> None:
    config = celery_config(Settings(redis_url="redis+sentinel://:p%40ss@10.0.0.1:26379,10.0.0.2:26380/main/3"))
    assert config["broker_url"] == "sentinel://:p%40ss@10.0.0.1:26379/3;sentinel://:p%40ss@10.0.0.2:26380/3"
    assert config["broker_transport_options"]["master_name"] == "main"
    target = parse_sentinel_url("redis+sentinel://:p%40ss@10.0.0.1:26379,10.0.0.2/main/3")
    assert target.sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26379)] and target.password == "p@ss"
    with pytest.raises(ConfigurationError, match="master"):
        parse_sentinel_url("redis+sentinel://10.0.0.1:26379")


def test_turns_complete_through_a_sentinel_failover(sentinel: SentinelSetup, prefix: str) -> None:
    from stepq.producer.client import Client

    settings = make_settings(prefix, redis_url=sentinel.url, lease_ttl_s=5.0)
    client = Client(settings)
    workers = [WorkerProcess(settings, f"s{i}") for i in (1, 2)]
    try:
        handles = [client.submit("rt.slow_stream", prompt="go", metadata={"prefix": prefix}) for _ in range(3)]
        for event in handles[0].events(idle_timeout=120):
            if event.type == EventType.TEXT_DELTA and event.step == 1:
                break
        sentinel.failover()
        results = [h.wait(timeout=300) for h in handles]
        exited = [w.name for w in workers if w.proc.poll() is not None]
    finally:
        for w in workers:
            w.stop()
    assert not exited
    assert all(r.status == TurnStatus.COMPLETED for r in results), [r.error for r in results]
    assert sentinel.master_port() == sentinel.replica_port  # it really ran on the promoted replica at the end
