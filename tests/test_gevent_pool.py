"""`stepq worker --pool gevent`: the same turns, approvals and tool timeouts on a gevent worker process.

Celery monkey-patches the worker before anything is imported, so stepq's threads (lease heartbeat,
flush timer, tool executor) become greenlets; these tests run real turns through such a worker.
"""

from __future__ import annotations

from collections import Counter

import pytest

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
