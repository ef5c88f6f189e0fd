"""Crashes and duplicates: kill -9 mid-stream (Redis and RabbitMQ brokers), a step longer than the
visibility timeout, duplicated run_step messages. State, streams and approvals live in Redis."""

from __future__ import annotations

import os
import signal

import pytest
import redis
from kombu import Connection

from stepq.fleet.protocol import RUN_STEP
from stepq.models import EventType, TurnStatus
from tests.conftest import AMQP_URL, REDIS_URL, WorkerProcess, amqp_available, eventually, make_settings


def _side_effects(prefix: str, turn_id: str, label: str) -> int:
    client = redis.Redis.from_url(REDIS_URL)
    value = client.get(f"{prefix}:side-effects:{turn_id}:{label}")
    return int(value or 0)


def _kill_mid_stream(settings, prefix):
    from stepq.producer.client import Client

    client = Client(settings)
    workers = [WorkerProcess(settings, "w1"), WorkerProcess(settings, "w2")]
    try:
        handle = client.submit("rt.slow_stream", prompt="go", metadata={"prefix": prefix})
        pids = {f":{w.proc.pid}": w for w in workers}
        victim = None
        running_step_start = None
        seen = []
        for event in handle.events(idle_timeout=120):
            seen.append(event)
            if event.type == EventType.STEP_START and event.step == 1:
                running_step_start = event
            if event.type == EventType.TEXT_DELTA and event.step == 1 and victim is None:
                worker_id = running_step_start.data["worker"]
                victim = next(w for suffix, w in pids.items() if worker_id.endswith(suffix))
                os.kill(victim.proc.pid, signal.SIGKILL)  # mid-stream, no warning
                victim.proc.wait(timeout=30)
        result = handle.wait(timeout=120)
        return result, seen, victim, handle.turn_id
    finally:
        for w in workers:
            w.stop()


def _assert_recovered(result, seen, victim, prefix, turn_id):
    assert victim is not None
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "x" * 40
    types = [(e.type, e.step) for e in seen]
    assert (EventType.STEP_RESET, 1) in types
    starts = [e for e in seen if e.type == EventType.STEP_START and e.step == 1]
    assert len(starts) == 2 and starts[0].data["worker"] != starts[1].data["worker"]
    reset_at = types.index((EventType.STEP_RESET, 1))
    assert seen[reset_at].seq < starts[1].seq  # subscribers drop the partial output before the re-run
    after = "".join(
        e.data["text"] for e in seen if e.type == EventType.TEXT_DELTA and e.seq > starts[1].seq and e.step == 1
    )
    assert after == "x" * 40
    assert _side_effects(prefix, turn_id, "once") == 1
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))


def test_sigkill_mid_stream_recovers_on_other_worker_redis_broker(prefix):
    # the broker would only redeliver after an hour: recovery must come from lease expiry + the sweeper
    settings = make_settings(prefix, visibility_timeout_s=3600)
    result, seen, victim, turn_id = _kill_mid_stream(settings, prefix)
    _assert_recovered(result, seen, victim, prefix, turn_id)


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_sigkill_mid_stream_recovers_on_other_worker_rabbitmq_broker(prefix):
    settings = make_settings(prefix, broker_url=AMQP_URL)
    try:
        result, seen, victim, turn_id = _kill_mid_stream(settings, prefix)
        _assert_recovered(result, seen, victim, prefix, turn_id)
    finally:
        with Connection(AMQP_URL) as conn:
            channel = conn.channel()
            for name in (settings.queue,):
                try:
                    channel.queue_delete(name)
                    channel.exchange_delete(name)
                except Exception:
                    pass


def test_sigkill_between_tool_calls_reuses_the_stored_result(prefix):
    """Killed after one tool ran and before the step committed: the re-run reuses the stored result."""
    from stepq.producer.client import Client

    settings = make_settings(prefix)
    client = Client(settings)
    workers = [WorkerProcess(settings, "t1"), WorkerProcess(settings, "t2")]
    try:
        handle = client.submit("rt.side_effect_then_slow", prompt="go", metadata={"prefix": prefix})
        seen, victim, starter = [], None, None
        for event in handle.events(idle_timeout=120):
            seen.append(event)
            if event.type == EventType.STEP_START and starter is None:
                starter = event.data["worker"]
            if event.type == EventType.TOOL_RESULT and event.data["name"] == "rt_marker_side_effect" and not victim:
                victim = next(w for w in workers if starter.endswith(f":{w.proc.pid}"))
                os.kill(victim.proc.pid, signal.SIGKILL)  # while rt_slow_work runs, before the commit
                victim.proc.wait(timeout=30)
        result = handle.wait(timeout=120)
    finally:
        for w in workers:
            w.stop()
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "both done"
    assert _side_effects(prefix, handle.turn_id, "mid-tools") == 1  # not executed again by the re-run
    assert (EventType.STEP_RESET, 0) in [(e.type, e.step) for e in seen]
    starts = [e for e in seen if e.type == EventType.STEP_START and e.step == 0]
    assert len(starts) == 2 and starts[1].data.get("replayed") is True  # the model was not asked again
    replayed = "".join(
        e.data["text"] for e in seen if e.type == EventType.TEXT_DELTA and e.seq > starts[1].seq and e.step == 0
    )
    assert replayed == "doing two things"  # subscribers that dropped the partial step see it whole


def test_step_longer_than_visibility_timeout_runs_once(prefix):
    from celery.contrib.testing.worker import start_worker

    from stepq.fleet.metrics import STEP_DELIVERIES
    from stepq.producer.client import Client
    from stepq.workers.app import create_app
    from tests.agents_engine import gate_key

    # the broker restores the unacked message after ~1 s; the step's tool holds it on a gate until the test
    # has seen that second delivery, so the step outlasts the visibility timeout however slow the machine
    options = {"visibility_timeout": 1, "unacked_restore_interval": 0.2, "unacked_restore_throttle": 1}
    settings = make_settings(prefix, broker_transport_options=options, lease_ttl_s=2.0)
    client = Client(settings)
    leased = STEP_DELIVERIES.labels("reschedule")
    before = leased._value.get()
    app = create_app(settings)
    with start_worker(app, pool="threads", concurrency=3, perform_ping_check=False, queues=[settings.queue]):
        handle = client.submit("eng.gated", prompt="go", metadata={"prefix": prefix})
        try:
            # the broker did deliver the step again while it ran: that delivery found the live lease
            eventually(lambda: leased._value.get() > before, 120, "the restored message to find the live lease")
        finally:
            client.runtime.redis.rpush(gate_key(prefix, "g"), "open")
        result = handle.wait(timeout=120)
    events = list(handle.events())
    assert result.status == TurnStatus.COMPLETED, result.error
    starts = [e for e in events if e.type == EventType.STEP_START and e.step == 0]
    assert len(starts) == 1  # never executed twice, concurrently or after
    assert EventType.STEP_RESET not in [e.type for e in events]
    assert len([e for e in events if e.type == EventType.TOOL_RESULT]) == 1  # the tool ran once


def test_duplicated_run_step_message_is_a_noop(worker, client, prefix):
    handle = client.submit("rt.slow_stream", prompt="go", metadata={"prefix": prefix})
    for _ in range(3):  # the same step, delivered again and again
        client.celery.send_task(RUN_STEP, args=[handle.turn_id, 0], queue=client.settings.queue)
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    events = list(handle.events())
    assert len([e for e in events if e.type == EventType.STEP_START and e.step == 0]) == 1
    assert _side_effects(prefix, handle.turn_id, "once") == 1
    # and once the turn is done, a late duplicate changes nothing
    from stepq.engine.runner import StepRunner

    before = client.runtime.events.last_seq(handle.turn_id)
    assert StepRunner(client.runtime).deliver(handle.turn_id, 0).action == "none"
    assert client.runtime.events.last_seq(handle.turn_id) == before
