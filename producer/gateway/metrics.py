"""The gateway's own Prometheus metrics, in a registry of their own (one per app: tests build several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "stepq_gateway_requests_total",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "stepq_gateway_open_streams", "SSE event streams open right now", registry=self.registry
        )
        self.stream_duration = Histogram(
            "stepq_gateway_stream_duration_seconds",
            "How long SSE event streams stayed open",
            buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.subscribed_channels = Gauge(
            "stepq_gateway_subscribed_channels",
            "Turn channels the shared pub/sub connection is subscribed to",
            registry=self.registry,
        )
