"""The `stepq batch` summary's cost is the sum of the turns' own stored costs: cached tokens priced at the
cache price, and tokens billed for failed attempts, counted — not `input x price + output x price`.
The body of `stepq batch` runs in this process against an in-process worker on real Redis, with the
real Anthropic SDK against the wire fake."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from stepq.config.settings import Settings
from stepq.models import TurnStatus
from stepq.producer.batch import run_batch_command
from stepq.producer.render import money
from tests.conftest import make_settings
from tests.fakes import anthropic_server as anth

PRICES = {
    "anthropic/claude-test": {
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cache_read_per_mtok": 0.3,
        "cache_write_per_mtok": 3.75,
    }
}
ITEMS = 3


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, prices=PRICES)


@pytest.fixture
def anthropic_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[anth.FakeAnthropic]:
    server = anth.FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-batch-cost")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield server
    server.stop()


def _cost(uncached: int, output: int, read: int = 0, write: int = 0) -> Decimal:
    price = {k: Decimal(str(v)) for k, v in PRICES["anthropic/claude-test"].items()}
    total = (
        uncached * price["input_per_mtok"]
        + output * price["output_per_mtok"]
        + read * price["cache_read_per_mtok"]
        + write * price["cache_write_per_mtok"]
    )
    return total / Decimal(1_000_000)


def test_summary_cost_is_the_sum_of_the_turns_stored_costs(worker, client, anthropic_fake, tmp_path: Path, capsys):
    # one attempt fails after message_start (billed 5,000 input tokens, 1 output), then every item answers
    # with mostly cached input: the cache price and the failed attempt both change the total
    anthropic_fake.enqueue(
        anth.SSEReply([anth.message_start(5000, cache_read=1000), anth.error_event("overloaded_error", "Overloaded")]),
        *(anth.text_reply("ok", input_tokens=1000, output_tokens=10, cache_read=200_000) for _ in range(ITEMS)),
    )
    source = tmp_path / "items.jsonl"
    source.write_text("".join(json.dumps({"key": f"k{i}", "prompt": f"item {i}"}) + "\n" for i in range(ITEMS)))
    output = tmp_path / "out.jsonl"

    code = run_batch_command(client, "anthropic_t.chat", source, output, resume=False, concurrency=ITEMS, batch_id=None)
    err = capsys.readouterr().err
    assert code == 0, err

    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert {r["status"] for r in rows} == {TurnStatus.COMPLETED.value}
    stored = [client.get(r["turn_id"]).cost for r in rows]
    expected = ITEMS * _cost(1000, 10, read=200_000) + _cost(5000, 1, read=1000)
    assert sum(Decimal(str(c)) for c in stored) == expected  # every turn priced its own usage
    assert f"cost: {money(float(expected))}" in err.splitlines()
    # what input x price + output x price over the turns' usage says: cache reads free, no cache price
    naive = (Decimal(ITEMS * 1000 + 5000) * 3 + Decimal(ITEMS * 10 + 1) * 15) / Decimal(1_000_000)
    assert f"cost: {money(float(naive))}" not in err
