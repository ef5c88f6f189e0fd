"""Shared rate limits across worker processes, adaptive back-off on 429, and queue priorities."""

from __future__ import annotations

from stepq.engine.runner import StepRunner
from stepq.heartbeat import live_workers
from stepq.models import EventType, TurnStatus
from stepq.ratelimit import RateLimit
from stepq.submit import create_turn
from tests.conftest import WorkerProcess, eventually


def _start_times(client, handles):
    times = []
    for h in handles:
        starts = [e.ts for e in client.runtime.events.read(h.turn_id) if e.type == EventType.STEP_START]
        times.extend(starts)
    return sorted(times)


def test_rpm_limit_holds_across_two_worker_processes(settings, client):
    workers = [WorkerProcess(settings, "rl1", beat=False), WorkerProcess(settings, "rl2", beat=False)]
    try:
        # both workers consuming before the first turn, so the limit is exercised across processes
        eventually(lambda: len(live_workers(client.runtime.redis, settings.key_prefix)) >= 2, 60, "two live workers")
        handles = [client.submit("bt.limited", prompt=f"item {i}") for i in range(9)]
        results = [h.wait(timeout=120) for h in handles]
    finally:
        for w in workers:
            w.stop()
    assert all(r.status == TurnStatus.COMPLETED for r in results)
    starts = _start_times(client, handles)
    assert len(starts) == 9
    # in any window shorter than the 2 s limit window at most 3 model calls started (sliding log)
    for i in range(len(starts) - 3):
        assert starts[i + 3] - starts[i] >= 2.0 * 0.9
    workers_used = {
        e.data["worker"]
        for h in handles
        for e in client.runtime.events.read(h.turn_id)
        if e.type == EventType.STEP_START
    }
    assert len(workers_used) == 2  # the limit was shared, not per process


def test_no_capacity_requeues_with_countdown_and_holds_nothing(rt):
    state, _ = create_turn(rt, "bt.one_at_a_time", prompt="go")
    held = rt.limiter.acquire("scripted/solo-model", RateLimit(concurrency=1), 10)
    assert held.allowed
    decision = StepRunner(rt).deliver(state.turn_id, 0)
    assert decision.action == "reschedule" and decision.countdown > 0 and "concurrency" in decision.reason
    assert not rt.redis.exists(rt.keys.lease(state.turn_id))  # the worker let go of the turn
    assert [e.type for e in rt.events.read(state.turn_id)] == [EventType.TURN_START]  # no step started
    rt.limiter.release("scripted/solo-model", held, 10)
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"
    assert rt.turns.load(state.turn_id).status == TurnStatus.COMPLETED


def test_429_tightens_the_shared_limit_for_the_fleet(rt):
    scope = "scripted/throttled-model"
    assert rt.limiter.penalty(scope) == 1.0
    failing, _ = create_turn(rt, "bt.throttled", prompt="go")
    assert StepRunner(rt).deliver(failing.turn_id, 0).action == "retry"
    assert rt.limiter.penalty(scope) == 0.5
    # another agent on the same provider/model now waits for the provider's retry-after
    other, _ = create_turn(rt, "bt.same_model", prompt="go")
    decision = StepRunner(rt).deliver(other.turn_id, 0)
    assert decision.action == "reschedule" and "paused" in decision.reason
    assert 0 < decision.countdown <= 5.0


def test_chat_turn_starts_before_queued_batch_items(settings, client):
    from celery.contrib.testing.worker import start_worker

    from stepq.protocol import worker_queues
    from stepq.workers.app import create_app

    batch = [client.submit("bt.batch_item", prompt=f"item {i}") for i in range(12)]
    assert client.get(batch[0].turn_id).priority == "batch"
    chat_submitted_before_worker = client.submit("bt.chat", prompt="hi")
    app = create_app(settings)
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, queues=worker_queues(settings)):
        chat_result = chat_submitted_before_worker.wait(timeout=60)
        results = [h.wait(timeout=120) for h in batch]
    assert chat_result.status == TurnStatus.COMPLETED
    assert all(r.status == TurnStatus.COMPLETED for r in results)
    chat_start = _start_times(client, [chat_submitted_before_worker])[0]
    batch_starts = _start_times(client, batch)
    # every batch item was queued before the chat turn, yet the chat turn ran first
    assert chat_start < min(batch_starts)


def test_rpm_limit_counted_at_the_upstream_across_two_worker_processes(settings, client, monkeypatch):
    from tests.fakes import anthropic_server as anth

    fake = anth.FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-ratelimit")
    fake.enqueue(*(anth.text_reply("ok") for _ in range(8)))
    workers = [WorkerProcess(settings, "up1", beat=False), WorkerProcess(settings, "up2", beat=False)]
    try:
        handles = [client.submit("bt.anthropic_limited", prompt=f"item {i}") for i in range(8)]
        results = [h.wait(timeout=120) for h in handles]
    finally:
        for w in workers:
            w.stop()
        fake.stop()
    assert all(r.status == TurnStatus.COMPLETED for r in results), [r.error for r in results]
    arrivals = sorted(r.received_at for r in fake.requests)
    assert len(arrivals) == 8
    # the upstream never saw more than 3 requests inside the 2 s window (allowing for clock jitter)
    for i in range(len(arrivals) - 3):
        assert arrivals[i + 3] - arrivals[i] >= 2.0 * 0.9
