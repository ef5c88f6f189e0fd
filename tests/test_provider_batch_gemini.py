"""Gemini batch mode (inlined requests) through the real google-genai SDK against the fake Gemini API:
a tool turn whose two steps both go through batches, a failed request retried in the next batch,
spent attempts -> online, and the deadline -> cancel -> online. The engine is driven in-process as in
tests/test_provider_batch.py (StepRunner deliveries + the tick, as the task shells would)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from stepq.batches import provider as provider_batches
from stepq.config.settings import Settings
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.models import EventType, TurnStatus
from tests.conftest import eventually, make_settings
from tests.fakes import gemini_server as g
from tests.test_provider_batch import deliver, events, run_to_end, submit
from tests.test_provider_gemini import _GOOGLE_VARS

AGENT = "agents_pbatch.gemini_tools"


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, provider_batch_window_s=0, retry_max_attempts=2)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[g.FakeGemini]:
    server = g.FakeGemini().start()
    for var in _GOOGLE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GOOGLE_API_KEY", "gemini-test-key-0123456789")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.base_url)
    yield server
    server.stop()


def batch_creates(fake: g.FakeGemini) -> list[dict[str, object]]:
    return [r.body for r in fake.requests if ":batchGenerateContent" in r.path]


def test_gemini_tool_turn_goes_through_two_batches(rt: Runtime, fake: g.FakeGemini) -> None:
    fake.enqueue(
        g.parts_reply(g.function_call("pbatch_lookup", {"sku": "A-1"})),
        g.text_reply("enriched ", "A-1", prompt=30, candidates=4),
    )
    turn_id = submit(rt, agent=AGENT)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED, state.error
    assert state.text == "enriched A-1"
    assert [t.batch for t in state.trace.steps] == [True, True]
    assert state.trace.steps[1].usage.input_tokens == 30
    creates = batch_creates(fake)
    assert len(creates) == 2 and not [r for r in fake.requests if "streamGenerateContent" in r.path]
    second = creates[1]["batch"]["inputConfig"]["requests"]["requests"][0]  # type: ignore[index]
    assert second["metadata"]["custom_id"] == f"{turn_id}-1-0"
    assert "functionResponse" in json.dumps(second["request"]["contents"])
    kinds = [e.type for e in events(rt, turn_id)]
    assert kinds.count(EventType.STEP_BATCHED) == 2 and EventType.TOOL_RESULT in kinds


def test_gemini_failed_request_is_retried_then_runs_online(rt: Runtime, fake: g.FakeGemini) -> None:
    fake.enqueue(
        g.rate_limited(),  # in batch 1
        g.ErrorReply(503, "The model is overloaded", "UNAVAILABLE"),  # in batch 2: attempts spent
        g.text_reply("online"),  # the streamed call
    )
    turn_id = submit(rt, agent=AGENT)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and (state.status, state.text) == (TurnStatus.COMPLETED, "online")
    assert len(batch_creates(fake)) == 2 and state.trace.steps[0].batch is False
    assert len([r for r in fake.requests if "streamGenerateContent" in r.path]) == 1


def test_gemini_fatal_request_error_fails_the_turn(rt: Runtime, fake: g.FakeGemini) -> None:
    fake.enqueue(g.ErrorReply(400, "Invalid JSON payload", "INVALID_ARGUMENT"))
    turn_id = submit(rt, agent=AGENT)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.FAILED and "Invalid JSON payload" in (state.error or "")


def test_gemini_past_the_deadline_the_batch_is_cancelled_and_the_step_runs_online(
    prefix: str, fake: g.FakeGemini
) -> None:
    rt = get_runtime(make_settings(prefix, provider_batch_window_s=0, provider_batch_deadline_s=0.2))
    fake.batches_end = False
    fake.enqueue(g.text_reply("too late"), g.text_reply("online"))
    turn_id = submit(rt, agent=AGENT)
    deliver(rt, turn_id)
    assert provider_batches.tick(rt).sent == 1
    report = provider_batches.TickReport()

    def ticked() -> bool:
        nonlocal report
        report = provider_batches.tick(rt)
        return report.expired == 1

    eventually(ticked, what="the batch's deadline")
    assert fake.cancelled == list(fake.batches)
    for turn_id_, _ in report.resume:
        deliver(rt, turn_id_)
    state = rt.turns.load(turn_id)
    assert state is not None and (state.status, state.text) == (TurnStatus.COMPLETED, "online")
