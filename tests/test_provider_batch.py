"""Provider batch APIs: steps of `provider_batch=True` turns park their model requests, the tick sends
them in provider batches (real SDKs against the wire fakes), and the answers continue each turn.

Most tests drive the engine in-process (StepRunner deliveries + `provider_batches.tick`, no broker),
as the task shell would; the end-to-end test runs a Celery worker subprocess with its beat."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from stepq.batches import provider as provider_batches
from stepq.config.settings import Prices, Settings
from stepq.engine.runner import StepRunner
from stepq.errors import SubmitError
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.models import EventType, TurnStatus
from stepq.producer.render import trace_table
from stepq.producer.status import collect_status
from stepq.store.pbatch import ProviderBatchStore
from stepq.turns.submit import create_turn
from tests.conftest import WorkerProcess, eventually, make_settings
from tests.fakes.anthropic_server import (
    ErrorReply,
    ExpiredResult,
    FakeAnthropic,
    stream,
    text_block,
    text_reply,
    tool_use_block,
)

API_KEY = "sk-ant-test-0123456789abcdef"
ANTHROPIC = "agents_pbatch.anthropic_tools"
PRICES = {"anthropic": Prices(input_per_mtok=3.0, output_per_mtok=15.0), "scripted": Prices(input_per_mtok=1.0)}


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, provider_batch_window_s=0, retry_max_attempts=2, prices=PRICES)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("ANTHROPIC_PROFILE", raising=False)
    yield server
    server.stop()


def submit(rt: Runtime, agent: str = ANTHROPIC, **kwargs: Any) -> str:
    state, _ = create_turn(rt, agent, prompt="enrich sku A-1", priority="batch", provider_batch=True, **kwargs)
    return state.turn_id


def deliver(rt: Runtime, turn_id: str) -> str:
    """Deliver the turn's current step until it parks, ends, or waits (retry countdowns are waited out)."""
    while True:
        state = rt.turns.load(turn_id)
        assert state is not None
        decision = StepRunner(rt).deliver(turn_id, state.step)
        if decision.action in ("next", "retry"):
            continue
        if decision.action == "reschedule":
            time.sleep(max(decision.countdown, 0.0))  # the retry's not_before: the state says when
            continue
        return decision.reason


def status(rt: Runtime, turn_id: str) -> TurnStatus:
    state = rt.turns.load(turn_id)
    assert state is not None
    return state.status


def events(rt: Runtime, turn_id: str) -> list[Any]:
    return rt.events.read(turn_id)


def run_to_end(rt: Runtime, *turn_ids: str, ticks: int = 10) -> provider_batches.TickReport:
    """Deliver, tick, deliver the answered steps... until every turn has ended."""
    last = provider_batches.TickReport()
    for turn_id in turn_ids:
        deliver(rt, turn_id)
    for _ in range(ticks):
        if all(status(rt, t).terminal for t in turn_ids):
            return last
        last = provider_batches.tick(rt, force_flush=True)
        for turn_id, _step in last.resume:
            deliver(rt, turn_id)
    raise AssertionError(f"turns not finished: {[status(rt, t) for t in turn_ids]}")


def tool_call_reply() -> Any:
    return stream(tool_use_block(0, "toolu_1", "pbatch_lookup", ['{"sku": "A-1"}']), stop_reason="tool_use")


# --------------------------------------------------------------------------- submit


def test_provider_batch_needs_batch_priority(rt: Runtime) -> None:
    with pytest.raises(SubmitError, match="provider_batch=True needs priority='batch'"):
        create_turn(rt, "demo.support", prompt="hi", priority="interactive", provider_batch=True)


# --------------------------------------------------------------------------- Anthropic Message Batches


def test_anthropic_turn_with_a_tool_call_goes_through_two_batches(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(tool_call_reply(), stream(text_block(0, ["enriched: ", "product A-1"]), input_tokens=40))
    fake.batches_end = False
    turn_id = submit(rt)
    assert deliver(rt, turn_id) == "parked for a provider batch"
    assert status(rt, turn_id) == TurnStatus.AWAITING_BATCH
    batched = [e for e in events(rt, turn_id) if e.type == EventType.STEP_BATCHED]
    assert len(batched) == 1 and batched[0].data["provider"] == "anthropic"
    shown = collect_status(rt)
    assert shown["awaiting_batch"]["count"] == 1 and shown["awaiting_approval"]["count"] == 0
    assert shown["active_turns"]["count"] == 0  # parked: no worker, nothing for the sweeper

    report = provider_batches.tick(rt)  # window 0: sent at once; the batch is still in progress
    assert (report.sent, report.collected) == (1, 0) and len(fake.batches) == 1
    assert deliver(rt, turn_id) == "waiting for its provider batch"  # an early delivery does nothing

    fake.end_batches()
    report = provider_batches.tick(rt)
    assert report.collected == 1 and report.resume == [(turn_id, 0)]
    assert deliver(rt, turn_id) == "parked for a provider batch"  # step 0 ran its tool; step 1 parked
    fake.end_batches()
    provider_batches.tick(rt)  # sends step 1
    fake.end_batches()
    report = provider_batches.tick(rt)
    assert report.resume == [(turn_id, 1)]
    deliver(rt, turn_id)

    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED
    assert state.text == "enriched: product A-1"
    assert [t.batch for t in state.trace.steps] == [True, True]
    assert "anthropic/claude-batch-test (batch)" in trace_table(state.trace)[1]
    assert not [r for r in fake.requests if r.path == "/v1/messages"]  # nothing streamed online
    creates = [r.body for r in fake.requests if r.path == "/v1/messages/batches"]
    assert len(creates) == 2
    second = creates[1]["requests"][0]
    assert second["custom_id"] == f"{turn_id}-1-0"
    assert second["params"]["messages"][-1]["content"][0]["type"] == "tool_result"
    kinds = [e.type for e in events(rt, turn_id)]
    assert kinds.count(EventType.TOOL_CALL) == 1 and kinds.count(EventType.TOOL_RESULT) == 1
    assert EventType.TEXT_DELTA in kinds and kinds[-1] == EventType.TURN_FINISH
    # billed at half the online price: (40 in * 3 + 5 out * 15) / 1e6 / 2 for step 1, (10*3 + 5*15) / 2e6 for step 0
    assert state.cost == pytest.approx((10 * 3 + 5 * 15 + 40 * 3 + 5 * 15) / 1e6 / 2)


def test_many_turns_share_one_provider_batch(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(*[text_reply(f"answer {i}") for i in range(3)])
    turns = [submit(rt) for _ in range(3)]
    for turn_id in turns:
        deliver(rt, turn_id)
    report = provider_batches.tick(rt)
    assert report.sent == 3 and len(fake.batches) == 1
    for turn_id, _ in report.resume:
        deliver(rt, turn_id)
    texts = sorted(rt.turns.load(t).text for t in turns)  # type: ignore[union-attr]
    assert texts == ["answer 0", "answer 1", "answer 2"]


def test_partial_failure_is_retried_in_the_next_batch(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(ErrorReply(529, "overloaded_error", "Overloaded"), text_reply("fine"), text_reply("second try"))
    first, second = submit(rt), submit(rt)
    run_to_end(rt, first, second)
    a, b = rt.turns.load(first), rt.turns.load(second)
    assert a is not None and b is not None
    assert (a.status, a.text, a.trace.steps[0].retries, a.trace.steps[0].batch) == (
        TurnStatus.COMPLETED, "second try", 1, True
    )  # fmt: skip
    assert (b.status, b.text, b.trace.steps[0].retries) == (TurnStatus.COMPLETED, "fine", 0)
    retry = [e for e in events(rt, first) if e.type == EventType.STEP_RETRY]
    assert len(retry) == 1 and "overloaded_error" in retry[0].data["error"]
    creates = [r.body["requests"] for r in fake.requests if r.path == "/v1/messages/batches"]
    assert [[x["custom_id"] for x in c] for c in creates] == [[f"{first}-0-0", f"{second}-0-0"], [f"{first}-0-1"]]


def test_spent_batch_attempts_run_online_when_allowed(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(
        ErrorReply(529, "overloaded_error", "Overloaded"),
        ErrorReply(500, "api_error", "Internal"),
        text_reply("online answer"),  # the streamed call
    )
    turn_id = submit(rt)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED and state.text == "online answer"
    assert state.trace.steps[0].batch is False
    assert len([r for r in fake.requests if r.path == "/v1/messages"]) == 1
    reasons = [e.data.get("reason", "") for e in events(rt, turn_id) if e.type == EventType.STEP_RETRY]
    assert any("running online" in r for r in reasons)


def test_spent_batch_attempts_fail_the_turn_without_online_fallback(prefix: str, fake: FakeAnthropic) -> None:
    rt = get_runtime(make_settings(prefix, provider_batch_window_s=0, retry_max_attempts=2,
                                   provider_batch_online_fallback=False))  # fmt: skip
    fake.enqueue(ErrorReply(529, "overloaded_error", "Overloaded"), ErrorReply(529, "overloaded_error", "Overloaded"))
    turn_id = submit(rt)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.FAILED
    assert "after 2 attempts" in (state.error or "")
    assert not [r for r in fake.requests if r.path == "/v1/messages"]


def test_a_fatal_error_in_a_batch_fails_the_turn(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(ErrorReply(400, "invalid_request_error", "max_tokens: too large"))
    turn_id = submit(rt)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.FAILED and "invalid_request_error" in (state.error or "")


def test_an_expired_result_runs_the_step_online(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(ExpiredResult(), text_reply("online"))
    turn_id = submit(rt)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and (state.status, state.text) == (TurnStatus.COMPLETED, "online")


def test_past_the_deadline_the_batch_is_cancelled_and_the_step_runs_online(prefix: str, fake: FakeAnthropic) -> None:
    rt = get_runtime(make_settings(prefix, provider_batch_window_s=0, provider_batch_deadline_s=0.2))
    fake.batches_end = False
    fake.enqueue(text_reply("too late"), text_reply("online"))
    turn_id = submit(rt)
    deliver(rt, turn_id)
    assert provider_batches.tick(rt).sent == 1
    expired = provider_batches.TickReport()

    def ticked() -> bool:
        nonlocal expired
        expired = provider_batches.tick(rt)
        return expired.expired == 1

    eventually(ticked, what="the batch's deadline")
    assert fake.cancelled == list(fake.batches)
    for turn_id_, _ in expired.resume:
        deliver(rt, turn_id_)
    state = rt.turns.load(turn_id)
    assert state is not None and (state.status, state.text) == (TurnStatus.COMPLETED, "online")
    assert state.trace.steps[0].batch is False


# --------------------------------------------------------------------------- durability


def test_a_step_rerun_before_its_park_commits_queues_its_request_once(rt: Runtime, fake: FakeAnthropic) -> None:
    from stepq.engine import batch_step

    turn_id = submit(rt)
    deliver(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None
    state.status = TurnStatus.RUNNING  # as if the park's commit never happened: the step runs again
    agent = rt.agents.get(ANTHROPIC)
    assert agent is not None
    from stepq.providers.base import StepRequest

    request = StepRequest(provider="anthropic", model="m", messages=state.messages)
    assert isinstance(batch_step.route(rt, state, agent, request, None), batch_step.Park)
    store = ProviderBatchStore(rt.redis, rt.keys, 60)
    assert store.pending(f"{state.provider}/{state.model}")[0] == 1


def test_a_tick_that_died_mid_submit_is_resubmitted_once(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.enqueue(text_reply("recovered"))
    turn_id = submit(rt)
    deliver(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None
    store = ProviderBatchStore(rt.redis, rt.keys, 60)
    group = f"{state.provider}/{state.model}"
    assert store.take(group, "pb_crashed", 10, time.time(), time.time() + 60) == [turn_id]  # ...then it died
    assert provider_batches.tick(rt).sent == 1 and len(fake.batches) == 1  # the next tick submits it
    report = provider_batches.tick(rt)
    assert report.collected == 1 and report.sent == 0 and len(fake.batches) == 1
    for turn_id_, _ in report.resume:
        deliver(rt, turn_id_)
    state = rt.turns.load(turn_id)
    assert state is not None and state.text == "recovered"
    assert provider_batches.tick(rt).sent == 0


def test_a_late_answer_after_the_turn_ended_is_dropped(rt: Runtime, fake: FakeAnthropic) -> None:
    fake.batches_end = False
    fake.enqueue(text_reply("late"))
    turn_id = submit(rt)
    deliver(rt, turn_id)
    provider_batches.tick(rt)
    rt.turns.request_cancel(turn_id)
    deliver(rt, turn_id)
    assert status(rt, turn_id) == TurnStatus.CANCELLED
    fake.end_batches()
    report = provider_batches.tick(rt)
    assert report.collected == 0 and report.resume == []


# --------------------------------------------------------------------------- scripted (offline)


def test_scripted_provider_batch_answers_offline(rt: Runtime) -> None:
    turn_id = submit(rt, agent="agents_pbatch.scripted")
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.text == "enriched A-1"
    assert [t.batch for t in state.trace.steps] == [True, True]
    assert state.trace.steps[1].cost == pytest.approx(1000 * 1.0 / 1e6 / 2)


def test_scripted_partial_failure_retries(rt: Runtime) -> None:
    turn_id = submit(rt, agent="agents_pbatch.scripted_flaky")
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.text == "done" and state.trace.steps[0].retries == 1


# --------------------------------------------------------------------------- end to end


def test_end_to_end_on_a_celery_worker_with_beat(prefix: str, fake: FakeAnthropic) -> None:
    settings = make_settings(prefix, provider_batch_window_s=0, provider_batch_poll_s=0.3)
    rt = get_runtime(settings)
    fake.enqueue(tool_call_reply(), text_reply("enriched on the worker"))
    from stepq.producer.client import Client

    worker = WorkerProcess(settings, "pbatch", beat=True)
    try:
        with Client(settings) as client:
            handle = client.submit(ANTHROPIC, prompt="enrich A-1", priority="batch", provider_batch=True)
            result = handle.wait(timeout=180)
            assert result.status == TurnStatus.COMPLETED and result.text == "enriched on the worker"
            assert [t.batch for t in result.trace.steps] == [True, True]
            kinds = [e.type for e in handle.events()]
            assert kinds.count(EventType.STEP_BATCHED) == 2 and EventType.TOOL_RESULT in kinds
    finally:
        worker.stop()
    assert len([r for r in fake.requests if r.path == "/v1/messages/batches"]) == 2
    assert not [r for r in fake.requests if r.path == "/v1/messages"]
    del rt


def test_cli_batch_submit_with_provider_batch(prefix: str, tmp_path: Any) -> None:
    """`stepq batch submit --provider-batch` → the workers' driver and tick → `stepq batch wait` writes results."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT, settings_env

    settings = make_settings(prefix, provider_batch_window_s=0, provider_batch_poll_s=0.3)
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"key": f"item-{i}", "prompt": f"sku {i}"}) + "\n" for i in range(5)))
    out = tmp_path / "out.jsonl"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stepq.producer.cli", *args], env=settings_env(settings),
                              cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip

    worker = WorkerProcess(settings, "pbatch-cli", beat=True)
    try:
        submit = cli("batch", "submit", "--agent", "agents_pbatch.scripted", "--input", str(items),
                     "--provider-batch", "--concurrency", "100")  # fmt: skip
        assert submit.returncode == 0, submit.stderr
        batch_id = submit.stdout.strip()
        wait = cli("batch", "wait", batch_id, "--output", str(out))
        assert wait.returncode == 0, wait.stderr
    finally:
        worker.stop()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["completed"] * 5 and {r["text"] for r in rows} == {"enriched A-1"}
    rt = get_runtime(settings)
    for row in rows:
        state = rt.turns.load(row["turn_id"])
        assert state is not None and state.provider_batch and [t.batch for t in state.trace.steps] == [True, True]
