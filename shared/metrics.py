"""Prometheus metrics (low-cardinality labels only: never turn ids)."""

from __future__ import annotations

from prometheus_client import Counter

STEP_DELIVERIES = Counter(
    "agentq_step_deliveries_total",
    "run_step deliveries by what they did (next, retry, reschedule, none)",
    ["action"],
)
