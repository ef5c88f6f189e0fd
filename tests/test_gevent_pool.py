"""`stepq worker --pool gevent`: the same turns, approvals and tool timeouts on a gevent worker process.

Celery monkey-patches the worker before anything is imported, so stepq's threads (lease heartbeat,
flush timer, tool executor) become greenlets; these tests run real turns through such a worker.
"""

from __future__ import annotations

from collections import Counter

import pytest

from stepq.fleet.protocol import broker_sized_for
from stepq.models import EventType, TurnStatus
from stepq.producer.client import Client
from tests.agents_engine import gate_key
from tests.conftest import WorkerProcess, make_settings
from tests.test_durability import _side_effects

pytest.importorskip("gevent")


@pytest.fixture
def gevent_client(prefix):
    settings = make_settings(prefix)
    worker = WorkerProcess(settings, "g1", beat=False, concurrency=50, pool="gevent")
    try:
        yield Client(settings)
    finally:
        worker.stop()


def test_concurrent_tool_turns_stream_gap_free(gevent_client, prefix):
    handles = [gevent_client.submit("rt.basic", prompt=f"go {i}", metadata={"prefix": prefix}) for i in range(30)]
    for handle in handles:
        result = handle.wait(timeout=120)
        assert result.status == TurnStatus.COMPLETED, result.error
        assert result.text == "all done here, thanks"
        events = list(handle.events())
        assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gap-free, in order
        kinds = Counter(e.type for e in events)
        assert kinds[EventType.TOOL_CALL] == 1 and kinds[EventType.TOOL_RESULT] == 1
        text = "".join(e.data["text"] for e in events if e.type == EventType.TEXT_DELTA and e.step == 1)
        assert text == "all done here, thanks"


def test_approval_parks_and_resumes(gevent_client, prefix):
    handle = gevent_client.submit("rt.approver", prompt="go", metadata={"prefix": prefix})
    request = next(e for e in handle.events(idle_timeout=60) if e.type == EventType.APPROVAL_REQUEST)
    assert _side_effects(prefix, handle.turn_id, "gated") == 0
    assert gevent_client.approve(request.data["approval_id"], True).wait(30)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED and result.text == "done"
    assert _side_effects(prefix, handle.turn_id, "gated") == 1


def test_tool_timeout_still_ends_the_wait(gevent_client, prefix):
    handle = gevent_client.submit("eng.stuck", prompt="go", metadata={"prefix": prefix})
    try:
        result = handle.wait(timeout=60)
    finally:
        gevent_client.runtime.redis.rpush(gate_key(prefix, "t"), "open")  # free the tool
    assert result.status == TurnStatus.COMPLETED and result.text == "went on"
    [event] = [e for e in handle.events() if e.type == EventType.TOOL_RESULT]
    assert event.data["output"] == {"error": "tool eng_stuck timed out after 0.2s", "status": "failed"}


def test_steps_ending_together_all_ack_and_the_worker_takes_more_work(prefix, tmp_path):
    """Each task acks from its own greenlet through the broker channel's connection pool. With kombu's 10
    connections, the 11th ack of steps ending at once raised MaxConnectionsError ("Couldn't ack"): the message
    stayed unacked (sent again only after the visibility timeout), and in `bench.streaming_capacity --pools
    gevent` the worker took no more work after its first round."""
    settings = make_settings(prefix)
    log = tmp_path / "worker.log"
    worker = WorkerProcess(settings, "g2", beat=False, concurrency=40, pool="gevent", log_path=str(log))
    client = Client(settings)
    try:
        for round_no in range(2):
            handles = [
                client.submit("eng.gated", prompt=f"round {round_no} turn {i}", metadata={"prefix": prefix})
                for i in range(40)
            ]
            for handle in handles:  # every turn is in its gated tool (or about to be): they end together
                next(e for e in handle.events(idle_timeout=60) if e.type == EventType.TOOL_CALL)
            client.runtime.redis.rpush(gate_key(prefix, "g"), *["open"] * len(handles))
            for handle in handles:
                result = handle.wait(timeout=60)
                assert result.status == TurnStatus.COMPLETED, (round_no, result.error)
    finally:
        worker.stop()
    assert "Couldn't ack" not in log.read_text()


def test_the_broker_pool_is_sized_for_the_workers_concurrency():
    assert broker_sized_for({"visibility_timeout": 5}, "redis://h:6379/0", 300) == {
        "visibility_timeout": 5,
        "max_connections": 310,
    }
    assert broker_sized_for({"max_connections": 50}, "redis://h:6379/0", 300) == {"max_connections": 50}  # the user's
    assert broker_sized_for({}, "amqp://guest@h//", 300) == {}  # kombu's Redis pool only
