"""Fast recovery at default settings: kill -9 a worker while an approved mutation runs, on each broker; the
turn completes (the sweeper covers approved-but-not-resumed parked steps, a redelivery waits only for the
dead worker's lease to lapse). Real worker processes; the default lease and sweep interval."""

from __future__ import annotations

import contextlib

import pytest
import redis
from kombu import Connection

from stepq.config.settings import Settings
from stepq.models import EventType, TurnStatus
from tests.agents_recovery import execution_key, keys_seen
from tests.conftest import AMQP_URL, REDIS_URL, WorkerProcess, amqp_available, eventually, make_settings

DEFAULTS = {name: Settings.model_fields[name].default for name in ("lease_ttl_s", "sweep_interval_s")}


def _counter(prefix: str, turn_id: str, what: str) -> str | None:
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as client:
        value: str | None = client.get(execution_key(prefix, turn_id, "gated", what))
        return value


def _kill_during_approved_mutation(settings: Settings, prefix: str) -> None:
    from stepq.producer.client import Client

    client = Client(settings)
    workers = [WorkerProcess(settings, "r1"), WorkerProcess(settings, "r2")]
    try:
        handle = client.submit("rc.approved_slow_mutation", prompt="go", metadata={"prefix": prefix})
        request = next(e for e in handle.events(idle_timeout=120) if e.type == EventType.APPROVAL_REQUEST)
        assert client.approve(request.data["approval_id"], True, reviewer="ops").wait(timeout=60)
        eventually(lambda: _counter(prefix, handle.turn_id, "started"), timeout=120, what="the approved tool to start")
        pid = int(_counter(prefix, handle.turn_id, "pid") or 0)
        victim = next(w for w in workers if w.proc.pid == pid)
        victim.kill()  # SIGKILL to its process group, while the approved mutation runs
        assert _counter(prefix, handle.turn_id, "done") is None  # killed mid-tool, not after
        result = handle.wait(timeout=240)
    finally:
        for w in workers:
            w.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "written"
    # the interrupted mutation ran again, with the same idempotency key, and finished once
    assert _counter(prefix, handle.turn_id, "started") == "2"
    assert _counter(prefix, handle.turn_id, "done") == "1"
    results = [e for e in handle.events() if e.type == EventType.TOOL_RESULT]
    assert len(results) == 1 and results[0].data["output"]["attempt"] == 2


def test_a_tool_killed_mid_call_runs_again_with_the_same_idempotency_key(prefix: str) -> None:
    """The rule docs/concepts/durability.md states: a tool interrupted mid-call (its worker SIGKILLed) runs again in another
    worker process with the same `ToolContext.idempotency_key`, which is what lets it make its effect once."""
    from stepq.producer.client import Client

    settings = make_settings(prefix)
    client = Client(settings)
    workers = [WorkerProcess(settings, "k1"), WorkerProcess(settings, "k2")]
    try:
        handle = client.submit("rc.approved_held_mutation", prompt="go", metadata={"prefix": prefix})
        seen = keys_seen(prefix, handle.turn_id)
        request = next(e for e in handle.events(idle_timeout=120) if e.type == EventType.APPROVAL_REQUEST)
        assert client.approve(request.data["approval_id"], True).wait(timeout=60)
        with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
            eventually(lambda: r.llen(seen) == 1, timeout=120, what="the approved tool's first run to start")
            pid = int(r.get(execution_key(prefix, handle.turn_id, "held", "pid")) or 0)
            victim = next(w for w in workers if w.proc.pid == pid)
            victim.kill()  # SIGKILL to its process group, during the tool call
            result = handle.wait(timeout=240)
            keys = r.lrange(seen, 0, -1)
    finally:
        for w in workers:
            w.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    [tool_result] = [e for e in handle.events() if e.type == EventType.TOOL_RESULT]
    output = tool_result.data["output"]
    assert output["run"] == 2 and len(keys) == 2  # it did run again, in the surviving worker
    assert keys[0] == keys[1] == output["idempotency_key"]


def test_kill_during_approved_mutation_redis_broker(prefix: str) -> None:
    # the broker would redeliver only after its visibility timeout (an hour): the sweeper must find the step
    _kill_during_approved_mutation(make_settings(prefix, **DEFAULTS), prefix)


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_kill_during_approved_mutation_rabbitmq_broker(prefix: str) -> None:
    settings = make_settings(prefix, broker_url=AMQP_URL, **DEFAULTS)
    try:
        _kill_during_approved_mutation(settings, prefix)
    finally:
        with Connection(AMQP_URL) as conn:
            channel = conn.channel()
            for name in (settings.queue, f"{settings.queue}.batch"):
                with contextlib.suppress(Exception):
                    channel.queue_delete(name)
                    channel.exchange_delete(name)


def test_sweeper_leaves_a_parked_turn_alone_while_a_person_decides(prefix: str) -> None:
    """The sweeper watches a parked turn only once its approvals are decided: before that, nothing runs."""
    from stepq.engine.decisions import sweep
    from stepq.fleet.runtime import get_runtime
    from stepq.producer.client import Client

    settings = make_settings(prefix, **DEFAULTS)
    client = Client(settings)
    rt = get_runtime(settings)
    worker = WorkerProcess(settings, "p1", beat=False)
    try:
        handle = client.submit("rc.approved_slow_mutation", prompt="go", metadata={"prefix": prefix})
        next(e for e in handle.events(idle_timeout=120) if e.type == EventType.APPROVAL_REQUEST)
        eventually(lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL, what="parked")
    finally:
        worker.stop()
    rt.turns.indexes.add("active", handle.turn_id, 0)  # as if watched long ago
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, settings.queued_grace_s) == []
    assert rt.turns.indexes.score("active", handle.turn_id) is None


def test_a_step_committed_but_never_sent_is_swept_at_once(rt, prefix: str) -> None:
    """The worker died after committing step 1 and before sending its message (the broker then has no
    message for the turn at all): the sweeper re-enqueues it after one lease TTL, not after the
    queued grace period."""
    from stepq.engine.decisions import sweep
    from stepq.engine.runner import StepRunner
    from stepq.turns.submit import create_turn

    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
    decision = StepRunner(rt).deliver(state.turn_id, 0)
    assert decision.action == "next" and decision.step == 1  # committed; the send never happens
    rt.turns.indexes.add("active", state.turn_id, 0)  # as if committed one lease TTL ago
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=3600) == [(state.turn_id, 1, "interactive")]
    # once its message is known to be sent, the same turn is left to the broker
    rt.turns.mark_sent(state.turn_id, 1)
    rt.turns.indexes.add("active", state.turn_id, 0)
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=3600) == []


def test_a_queued_turn_older_than_a_broker_reconnect_is_sent_again_once(rt, prefix: str) -> None:
    """A consumer's reconnect marks the moment (stepq.workers.reconnects); a queued turn untouched since
    before it is re-sent at the next sweep, once, and a turn listed after the mark is left to the broker."""
    import time

    from stepq.engine.decisions import sweep
    from stepq.turns.submit import create_turn
    from stepq.workers.reconnects import mark_reconnect

    before, _ = create_turn(rt, "rt.basic", prompt="queued before", metadata={"prefix": prefix})
    after, _ = create_turn(rt, "rt.basic", prompt="queued after", metadata={"prefix": prefix})
    now = time.time()
    rt.turns.indexes.add("active", before.turn_id, now - 60)  # listed a minute before the reconnect
    rt.turns.indexes.add("active", after.turn_id, now - 20)  # and one after it
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=3600) == []  # no reconnect yet: both wait for their messages
    mark_reconnect(rt.settings, now=now - 30)
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=3600) == [(before.turn_id, 0, "interactive")]
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=3600) == []  # the re-send moved it past the mark: not sent again
