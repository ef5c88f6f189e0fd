"""Cost of a model call from `STEPQ_PRICES`: exact decimal arithmetic, one float at the end.

Providers count cached input differently: Anthropic and Bedrock report `input_tokens` without cache
reads and writes, Gemini's prompt count includes cached tokens. Uncached input is billed at the input
price, cache reads and writes at their own prices (the input price when the table gives none).
"""

from __future__ import annotations

from decimal import Decimal

from stepq.config.settings import Prices
from stepq.models import Usage

# providers whose `input_tokens` already include `cache_read_tokens` (see docs/providers/)
INPUT_INCLUDES_CACHE_READS = frozenset({"gemini", "openai", "openai-compatible", "azure-openai"})
_MILLION = Decimal(1_000_000)


def _d(value: float) -> Decimal:
    return Decimal(str(value))  # the price as written in the table, not its binary float expansion


def cost_decimal(prices: Prices, provider: str, usage: Usage) -> Decimal:
    """What `usage` costs at `prices`, in the table's currency units."""
    read = usage.cache_read_tokens or 0
    write = usage.cache_write_tokens or 0
    uncached = usage.input_tokens - read if provider in INPUT_INCLUDES_CACHE_READS else usage.input_tokens
    read_price = prices.cache_read_per_mtok if prices.cache_read_per_mtok is not None else prices.input_per_mtok
    write_price = prices.cache_write_per_mtok if prices.cache_write_per_mtok is not None else prices.input_per_mtok
    total = (
        max(uncached, 0) * _d(prices.input_per_mtok)
        + usage.output_tokens * _d(prices.output_per_mtok)
        + read * _d(read_price)
        + write * _d(write_price)
    )
    return total / _MILLION


def find_prices(table: dict[str, Prices], provider: str, model: str) -> Prices | None:
    """The table's entry for `provider/model`, else for `provider` alone."""
    return table.get(f"{provider}/{model}") or table.get(provider)


def step_cost(
    table: dict[str, Prices], provider: str, model: str, usage: Usage, *, batch: bool = False
) -> float | None:
    """The cost of one call, or None when the table has no price for the model. `batch`: answered through
    the provider's batch API, billed at the entry's `batch_factor` (0.5: Anthropic, Gemini and Bedrock)."""
    prices = find_prices(table, provider, model)
    if prices is None:
        return None
    cost = cost_decimal(prices, provider, usage)
    return float(cost * _d(prices.batch_factor) if batch else cost)


def add_costs(*costs: float | None) -> float | None:
    """Sum of costs (None when none is known), added as decimals so the total does not drift."""
    known = [Decimal(str(c)) for c in costs if c is not None]
    return float(sum(known, Decimal(0))) if known else None
