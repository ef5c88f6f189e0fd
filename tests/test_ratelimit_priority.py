"""Shared rate limits across worker processes, adaptive back-off on 429, and queue priorities."""

from __future__ import annotations

import pytest

from stepq.engine.runner import StepRunner
from stepq.fleet.heartbeat import live_workers
from stepq.fleet.ratelimit import RateLimit
from stepq.models import EventType, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_batch import anthropic_limited, limited
from tests.conftest import WorkerProcess, eventually


def _start_times(client, handles):
    times = []
    for h in handles:
        starts = [e.ts for e in client.runtime.events.read(h.turn_id) if e.type == EventType.STEP_START]
        times.extend(starts)
    return sorted(times)


def _grants(client, handle) -> list[float]:
    """When the limiter granted each of the turn's model calls (Redis's clock, from the step-start events)."""
    events = client.runtime.events.read(handle.turn_id)
    starts = [e for e in events if e.type == EventType.STEP_START and not e.data.get("replayed")]
    return [e.data["rate_limit_granted_at"] for e in starts]


def _assert_spaced(grants: list[float], limit: RateLimit) -> None:
    """The limiter's own guarantee, exact: any `rpm` + 1 grants span at least the counting window. The
    comparison is the one the Lua script makes (`now - window` against the oldest grant), so no tolerance."""
    assert limit.rpm
    grants = sorted(grants)
    for i in range(len(grants) - limit.rpm):
        assert grants[i + limit.rpm] - limit.counting_window_s >= grants[i], (i, grants)


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
    grants = [g for h in handles for g in _grants(client, h)]
    assert len(grants) == 9  # one grant per model call
    # at most 3 grants in any 2 s + margin window (sliding log), whatever the two processes' timing
    _assert_spaced(grants, limited.rate_limit)
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

    from stepq.fleet.protocol import worker_queues
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

    limit = anthropic_limited.rate_limit
    assert limit is not None and limit.rpm == 3
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
    # every request the upstream saw is one grant's: one each, nothing sent around the limiter (an SDK retry)
    arrived = {_prompt(r.body): r.received_at for r in fake.requests}
    assert len(fake.requests) == 8 and sorted(arrived) == sorted(f"item {i}" for i in range(8))
    granted = {}
    for i, h in enumerate(handles):
        [granted[f"item {i}"]] = _grants(client, h)
    _assert_spaced(list(granted.values()), limit)
    # What the provider sees: each request lands some latency after its grant. Grants are spaced by
    # window + margin, so arrivals are spaced by at least that minus how much the latency varied; the
    # documented promise (never more than rpm in the provider's window) holds while that variation stays
    # within the margin. The tolerance is this run's measured variation, not a guess.
    latency = [arrived[p] - granted[p] for p in granted]
    spread = max(latency) - min(latency)
    arrivals = sorted(arrived.values())
    for i in range(len(arrivals) - limit.rpm):
        gap = arrivals[i + limit.rpm] - arrivals[i]
        assert gap >= limit.counting_window_s - spread - 1e-6, (i, arrivals, latency)
        if spread <= limit.margin_s:
            assert gap >= limit.window_s, (i, arrivals, latency)


def _prompt(body: dict) -> str:
    [message] = body["messages"]
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def test_a_grant_counts_for_the_window_plus_the_margin(rt):
    limit = RateLimit(rpm=2, window_s=60.0, margin_s=30.0)  # long: a slow machine cannot age a grant out
    first = rt.limiter.acquire("scripted/margin-model", limit, 10)
    second = rt.limiter.acquire("scripted/margin-model", limit, 10)
    refused = rt.limiter.acquire("scripted/margin-model", limit, 10)
    assert first.allowed and second.allowed and first.at <= second.at
    assert not refused.allowed and refused.reason == "rpm"
    # the refused step waits until the first grant has counted for window + margin, not just the window
    assert refused.at + refused.wait_s == pytest.approx(first.at + 90.0, abs=1e-6)
