"""Failover before the first chunk: a step whose attempts on its provider are spent with retryable errors,
before any content streamed, moves to the next fallback (agent `fallbacks`, else STEPQ_FALLBACKS). Real
worker, real Redis, the unmodified anthropic SDK against the fake Messages API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from stepq.agents.definition import AgentDefinition
from stepq.config.settings import Settings
from stepq.engine.retry import next_fallback
from stepq.models import EventType, Fallback, TurnStatus
from stepq.producer.render import trace_table
from tests.conftest import make_settings
from tests.fakes.anthropic_server import (
    ErrorReply,
    FakeAnthropic,
    SSEReply,
    error_event,
    message_start,
    stream,
    text_block,
    text_reply,
    tool_use_block,
)

WAIT = 120  # generous: a loaded machine; a passing run takes a second or two
ATTEMPTS = 3


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, coalesce_window_ms=0, retry_max_attempts=ATTEMPTS)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-failover-test")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield server
    server.stop()


def overloaded() -> ErrorReply:
    return ErrorReply(529, "overloaded_error", "Overloaded")


def run(client: Any, agent: str, prompt: str = "hi") -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt=prompt)
    result = handle.wait(timeout=WAIT)
    return result, list(handle.events())


def retries(events: list[Any]) -> list[Any]:
    return [e for e in events if e.type == EventType.STEP_RETRY]


def test_primary_529_on_every_attempt_moves_to_the_fallback_which_runs_a_tool_round_trip(worker, client, fake):
    fake.enqueue(*(overloaded() for _ in range(ATTEMPTS)), text_reply("must not be requested"))
    result, events = run(client, "failover_t.to_scripted", prompt="find x")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert len(fake.requests) == ATTEMPTS  # every attempt of the primary, then none
    # step 0 (tool call) and step 1 (answer) were served by the fallback; its step 1 saw the tool's result
    assert [(s.provider, s.model) for s in result.trace.steps] == [("scripted", "backup"), ("scripted", "backup")]
    assert result.trace.steps[0].tool_calls == ["failover_lookup"]
    assert 'failover_lookup={"answer": "result for x"}' in result.text
    *plain, moved = retries(events)
    assert [r.data["attempt"] for r in plain] == list(range(1, ATTEMPTS))
    assert all(r.data["status"] == 529 for r in retries(events))
    assert moved.data["from"] == {"provider": "anthropic", "model": "claude-primary"}
    assert moved.data["fallback"] == {"provider": "scripted", "model": "backup"}
    assert moved.data["code"] == "overloaded_error" and "failover after 3 attempts" in moved.data["reason"]
    starts = [e.data["provider"] for e in events if e.type == EventType.STEP_START]
    assert starts[-2:] == ["scripted", "scripted"]


def test_tool_round_trip_across_the_switch_translates_the_transcript(worker, client, fake):
    fake.enqueue(
        stream(
            tool_use_block(0, "toolu_fb", "failover_lookup", ['{"query": "y"}']),
            stop_reason="tool_use",
        ),
        text_reply("done on anthropic"),
    )
    result, events = run(client, "failover_t.to_anthropic", prompt="find y")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "done on anthropic"
    assert [s.provider for s in result.trace.steps] == ["anthropic", "anthropic"]
    [moved] = [r for r in retries(events) if "fallback" in r.data]
    assert moved.step == 0 and moved.data["from"]["provider"] == "scripted"
    first, second = fake.wait_for_requests(2)
    assert first.body["model"] == "claude-backup"
    assert first.body["messages"][0]["content"][0]["text"] == "find y"
    results = [b for m in second.body["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert results == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_fb",
            "content": '{"answer": "result for y"}',
            "is_error": False,
            **({"cache_control": results[0]["cache_control"]} if "cache_control" in results[0] else {}),
        }
    ]


def test_anthropic_to_openai_carries_the_tool_round_trip_in_openai_shape(worker, client, fake, monkeypatch):
    from tests.fakes.openai_server import FakeOpenAI, call_item, response_stream, response_text

    backup = FakeOpenAI().start()
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", backup.base_url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-failover-test")
        fake.enqueue(*(overloaded() for _ in range(ATTEMPTS)))
        backup.enqueue(
            response_stream(call_item("call_o", "failover_lookup", ['{"query": "o"}'])),
            response_text("openai answered"),
        )
        result, events = run(client, "failover_t.to_openai", prompt="find o")
        first, second = backup.wait_for_requests(2)
    finally:
        backup.stop()

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "openai answered"
    assert [(s.provider, s.model) for s in result.trace.steps] == [("openai", "gpt-backup")] * 2
    assert len(fake.requests) == ATTEMPTS
    assert first.body["input"] == [{"role": "user", "content": "find o"}]
    assert second.body["input"][-1] == {
        "type": "function_call_output",
        "call_id": "call_o",
        "output": '{"answer": "result for o"}',
    }
    assert retries(events)[-1].data["fallback"] == {"provider": "openai", "model": "gpt-backup"}


def test_billed_failed_attempts_name_the_primary_in_the_fallbacks_step(worker, client, fake):
    failing = SSEReply([message_start(input_tokens=321), error_event("overloaded_error", "Overloaded")])
    fake.enqueue(*(failing for _ in range(ATTEMPTS)))
    result, _ = run(client, "failover_t.to_scripted", prompt="find x")

    assert result.status == TurnStatus.COMPLETED, result.error
    step = result.trace.steps[0]
    assert step.provider == "scripted"
    assert [(a.provider, a.model, a.usage.input_tokens) for a in step.failed_attempts] == [
        ("anthropic", "claude-primary", 321)
    ] * ATTEMPTS
    table = trace_table(result.trace)
    assert table[1].split()[1] == "scripted/backup"
    assert all("on anthropic/claude-primary failed (overloaded_error)" in line for line in table[2 : 2 + ATTEMPTS])


def test_no_failover_after_content_was_streamed(worker, client, fake):
    partial = text_block(0, ["partial ", "answer"])[:3]
    fake.enqueue(SSEReply([message_start(), *partial, error_event("overloaded_error", "Overloaded")]))
    result, events = run(client, "failover_t.to_scripted")

    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "")
    assert not retries(events)
    assert [s.provider for s in result.trace.steps] in ([], ["anthropic"])
    assert len(fake.requests) == 1


def test_a_fatal_error_does_not_fail_over(worker, client, fake):
    fake.enqueue(ErrorReply(400, "invalid_request_error", "bad request"))
    result, events = run(client, "failover_t.to_scripted")

    assert result.status == TurnStatus.FAILED
    assert not retries(events)
    assert len(fake.requests) == 1


def test_operator_fallbacks_from_settings(prefix, fake, monkeypatch):
    from celery.contrib.testing.worker import start_worker

    from stepq.fleet.protocol import worker_queues
    from stepq.producer.client import Client
    from stepq.workers.app import create_app

    monkeypatch.setenv("STEPQ_FALLBACKS", '["scripted/ops"]')
    assert Settings().fallbacks == [Fallback(provider="scripted", model="ops")]
    settings = make_settings(prefix, coalesce_window_ms=0, retry_max_attempts=1, fallbacks=["scripted/ops"])
    assert settings.to_env()["STEPQ_FALLBACKS"] == '[{"provider": "scripted", "model": "ops"}]'
    fake.enqueue(ErrorReply(503, "api_error", "unavailable"))
    app = create_app(settings)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, queues=worker_queues(settings)):
        result, _ = run(Client(settings), "failover_t.operator")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "answered by the operator's fallback"
    assert [(s.provider, s.model) for s in result.trace.steps] == [("scripted", "ops")]
    assert len(fake.requests) == 1


def test_next_fallback_walks_the_list_once():
    chain = [Fallback(provider="bedrock", model="b"), Fallback.model_validate("gemini/g")]
    assert next_fallback(chain, "anthropic", "a") == chain[0]
    assert next_fallback(chain, "bedrock", "b") == chain[1]
    assert next_fallback(chain, "gemini", "g") is None
    assert next_fallback([], "anthropic", "a") is None


def test_bad_fallbacks_are_refused_with_a_clear_message():
    with pytest.raises(ValidationError, match="unknown providers"):
        AgentDefinition(id="failover_t.bad", fallbacks=[{"provider": "nope", "model": "m"}])
    with pytest.raises(ValidationError, match="provider/model"):
        Fallback.model_validate("no-slash")


def test_partial_tool_input_still_fails_over_and_every_attempt_is_reset(worker, client, fake):
    """Tool input is not answer content: a stream that breaks inside a call's arguments retries and fails over as
    one that broke before content, but each attempt's partial call is reset first (the fallback starts clean)."""
    partial = tool_use_block(0, "toolu_f", "failover_lookup", ['{"query"', ': "x"}'])[:2]  # start + one piece
    fake.enqueue(
        *(SSEReply([message_start(), *partial, error_event("overloaded_error", "Overloaded")]) for _ in range(ATTEMPTS))
    )
    result, events = run(client, "failover_t.to_scripted", prompt="find x")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.trace.steps[0].provider == "scripted"
    kinds = [e.type for e in events]
    assert kinds.count(EventType.TOOL_INPUT_DELTA) == ATTEMPTS
    assert kinds.count(EventType.STEP_RESET) == ATTEMPTS  # ATTEMPTS - 1 retries, then the failover
    moved = retries(events)[-1]
    last_piece = max(e.seq for e in events if e.type == EventType.TOOL_INPUT_DELTA)
    last_reset = max(e.seq for e in events if e.type == EventType.STEP_RESET)
    assert last_piece < last_reset < moved.seq and "failover" in moved.data["reason"]
