"""A turn's W3C trace context: the `traceparent` it was submitted under, stored with the turn so that every
step's spans (engine/otel_spans.py) join the caller's trace, however long the turn parks and wherever it
resumes. The gateway passes the request's header; `Client.submit` the caller's current OpenTelemetry span
(when `opentelemetry-api` is installed and a span is active). Nothing here needs OpenTelemetry installed.
"""

from __future__ import annotations

import re

# version 00: 32 hex trace id, 16 hex parent id, 2 hex flags; all-zero ids are invalid (W3C Trace Context §3.2)
_TRACEPARENT = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})$")


def valid(traceparent: object) -> str | None:
    """The header value when it is a well-formed version-00 `traceparent`; None otherwise (ignored, as the
    W3C spec says a receiver must: a bad header starts a new trace, it never fails the request)."""
    if not isinstance(traceparent, str):
        return None
    value = traceparent.strip().lower()
    return value if _TRACEPARENT.match(value) else None


def current() -> str | None:
    """The caller's active OpenTelemetry span as a `traceparent`, or None (no API installed, no span)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parts(traceparent: str) -> tuple[int, int, int]:
    """(trace id, parent span id, flags) of a valid `traceparent`."""
    _, trace_id, span_id, flags = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)
