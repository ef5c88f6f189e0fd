"""Exact usage and cost: tokens a failed attempt was billed for count (the step's trace lists the attempt,
the turn's totals include it), and every step and result carries its cost at STEPQ_PRICES, matching
the price table exactly. Anthropic and Gemini run through their real SDKs against the wire fakes."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY

from stepq.config.settings import Settings
from stepq.models import EventType, TurnStatus
from tests.conftest import eventually, make_settings
from tests.fakes import anthropic_server as anth
from tests.fakes import gemini_server as gem

WAIT = 120  # generous: the machine is shared and busy
TENANT_KEY = "customer"
# prices per million tokens, as an operator would write STEPQ_PRICES
PRICES = {
    "anthropic/claude-test": {
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cache_read_per_mtok": 0.3,
        "cache_write_per_mtok": 3.75,
    },
    "gemini/gemini-test": {"input_per_mtok": 1.25, "output_per_mtok": 10.0, "cache_read_per_mtok": 0.31},
}


def _expected(entry: dict[str, float], uncached: int, output: int, read: int = 0, write: int = 0) -> Decimal:
    """The price table applied by hand, in decimals (prices as written, per million tokens)."""
    price = {k: Decimal(str(v)) for k, v in entry.items()}
    read_price = price.get("cache_read_per_mtok", price["input_per_mtok"])
    write_price = price.get("cache_write_per_mtok", price["input_per_mtok"])
    total = (
        uncached * price["input_per_mtok"] + output * price["output_per_mtok"] + read * read_price + write * write_price
    )
    return total / Decimal(1_000_000)


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, prices=PRICES, metrics_tenant_key=TENANT_KEY)


@pytest.fixture
def anthropic_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[anth.FakeAnthropic]:
    server = anth.FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-usage")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("ANTHROPIC_PROFILE", raising=False)
    yield server
    server.stop()


@pytest.fixture
def gemini_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[gem.FakeGemini]:
    from tests.test_provider_gemini import _clear_env

    _clear_env(monkeypatch)
    server = gem.FakeGemini().start()
    monkeypatch.setenv("GOOGLE_API_KEY", "gemini-usage-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.base_url)
    yield server
    server.stop()


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _run(client: Any, agent: str, tenant: str) -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt="hi", metadata={TENANT_KEY: tenant})
    return handle.wait(timeout=WAIT), list(handle.events())


def test_anthropic_attempt_failing_after_message_start_counts_its_input_tokens(anthropic_fake, worker, client):
    tenant = f"acme-{client.settings.key_prefix}"
    labels = {"agent": "anthropic_t.chat", "tenant": tenant, "provider": "anthropic", "model": "claude-test"}
    anthropic_fake.enqueue(
        anth.SSEReply([anth.message_start(1234, cache_read=200), anth.error_event("overloaded_error", "Overloaded")]),
        anth.text_reply("fine", input_tokens=1300, output_tokens=7, cache_read=200, cache_write=50),
    )
    result, events = _run(client, "anthropic_t.chat", tenant)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert len(anthropic_fake.requests) == 2  # one failed attempt, one retry
    [step] = result.trace.steps
    [failed] = step.failed_attempts
    assert failed.attempt == 0 and failed.error == "overloaded_error"
    assert failed.usage.input_tokens == 1234 and failed.usage.cache_read_tokens == 200
    assert step.usage.input_tokens == 1300 and step.usage.output_tokens == 7
    # the turn's totals: both attempts (the failed one's message_start reported one output token)
    assert result.usage.input_tokens == 1234 + 1300
    assert result.usage.output_tokens == 1 + 7
    assert result.usage.cache_read_tokens == 400 and result.usage.cache_write_tokens == 50

    entry = PRICES["anthropic/claude-test"]
    failed_cost = _expected(entry, uncached=1234, output=1, read=200)
    ok_cost = _expected(entry, uncached=1300, output=7, read=200, write=50)
    assert failed.cost == float(failed_cost)
    assert step.cost == float(failed_cost + ok_cost)
    assert result.cost == float(failed_cost + ok_cost)
    [finish] = [e for e in events if e.type == EventType.TURN_FINISH]
    assert finish.data["cost"] == result.cost and finish.data["usage"]["input_tokens"] == 2534

    # a step is counted when its delivery returns, just after the turn-finish a waiter sees; cost is counted last
    expected_cost = float(failed_cost + ok_cost)
    eventually(
        lambda: _metric("stepq_cost_total", **labels) >= expected_cost * (1 - 1e-12), WAIT, "the step's usage counted"
    )
    assert _metric("stepq_tokens_total", **labels, kind="input") == 2534
    assert _metric("stepq_tokens_total", **labels, kind="cache_read") == 400
    assert _metric("stepq_cost_total", **labels) == pytest.approx(expected_cost, rel=1e-12)


def test_anthropic_turn_failing_after_message_start_still_reports_the_tokens(anthropic_fake, worker, client):
    fatal = anth.SSEReply([anth.message_start(777), anth.error_event("invalid_request_error", "bad request")])
    anthropic_fake.enqueue(fatal)
    result, _ = _run(client, "anthropic_t.chat", "solo")
    assert result.status == TurnStatus.FAILED
    assert result.usage.input_tokens == 777
    [step] = result.trace.steps  # the failed step gets its trace, with the billed attempt
    assert [a.usage.input_tokens for a in step.failed_attempts] == [777]
    assert result.cost == float(_expected(PRICES["anthropic/claude-test"], uncached=777, output=1))


def test_gemini_usage_metadata_before_an_error_counts(gemini_fake, worker, client):
    gemini_fake.enqueue(
        gem.SSEReply(
            [
                gem.chunk(usage_meta=gem.usage(prompt=900, candidates=0, cached=100)),
                gem.error_event(503, "The model is overloaded. Please try again later.", "UNAVAILABLE"),
            ]
        ),
        gem.text_reply("all good", prompt=950, candidates=12, cached=100),
    )
    result, _ = _run(client, "gemini_t.chat", "globex")
    assert result.status == TurnStatus.COMPLETED, result.error
    [step] = result.trace.steps
    [failed] = step.failed_attempts
    assert failed.usage.input_tokens == 900
    assert result.usage.input_tokens == 900 + 950 and result.usage.output_tokens == 12
    entry = PRICES["gemini/gemini-test"]
    # Gemini's prompt count includes the cached tokens: uncached input is the rest
    total = _expected(entry, uncached=800, output=0, read=100) + _expected(entry, uncached=850, output=12, read=100)
    assert result.cost == float(total)


def test_no_price_for_the_model_means_no_cost(anthropic_fake, worker, client, settings):
    settings.prices.clear()  # the worker reads the same Settings object
    anthropic_fake.enqueue(anth.text_reply("fine"))
    result, _ = _run(client, "anthropic_t.chat", "nobody")
    assert result.status == TurnStatus.COMPLETED
    assert result.cost is None and result.trace.steps[0].cost is None


def test_show_trace_prints_cost_and_the_failed_attempt(anthropic_fake, worker, client, settings):
    import json

    from tests.conftest import settings_env
    from tests.test_cli import stepq

    anthropic_fake.enqueue(
        anth.SSEReply([anth.message_start(1234), anth.error_event("overloaded_error", "Overloaded")]),
        anth.text_reply("fine", input_tokens=1300, output_tokens=7),
    )
    result, _ = _run(client, "anthropic_t.chat", "cli")
    env = settings_env(settings)
    header, row, attempt = stepq(env, "show", result.turn_id, "--trace", check=0).stdout.splitlines()
    assert header.split()[6] == "cost"  # "tool calls" is two words in the header, "-" one in the row
    entry = PRICES["anthropic/claude-test"]
    step_cost = _expected(entry, 1234, 1) + _expected(entry, 1300, 7)
    assert row.split()[5] == f"{float(step_cost):.8f}".rstrip("0")
    assert "attempt 0 failed (overloaded_error)" in attempt and "1234 input" in attempt
    [step] = json.loads(stepq(env, "show", result.turn_id, "--trace", "--json", check=0).stdout)
    assert step["cost"] == result.cost and step["failed_attempts"][0]["usage"]["input_tokens"] == 1234
    shown = stepq(env, "show", result.turn_id, check=0).stdout
    assert f"{float(step_cost):.8f}".rstrip("0") in shown and "2534 input" in shown
