"""Prometheus metrics (low-cardinality labels only: never turn ids)."""

from __future__ import annotations

from prometheus_client import Counter

STEP_DELIVERIES = Counter(
    "agentq_step_deliveries_total",
    "run_step deliveries by what they did (next, retry, reschedule, none)",
    ["action"],
)

RATE_LIMIT_WAITS = Counter(
    "agentq_rate_limiter_waits_total",
    "Steps re-queued because the shared rate limit had no capacity",
    ["provider", "model", "limit"],
)
