"""Classification helpers every adapter shares: which HTTP statuses retry, and Retry-After parsing."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from stepq.providers.base import ProviderError

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
FATAL_HINTS = {
    400: "the request was rejected as malformed; check the model name, tool schemas and parameters",
    401: "authentication failed; check the credentials variable",
    403: "permission denied for this model or project",
    404: "the model or endpoint was not found; check the model name and region",
    413: "the request is too large; shorten the prompt or tool results",
    422: "the request could not be processed; check parameters",
}


def parse_retry_after(headers: Mapping[str, Any] | None, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date."""
    if not headers:
        return None
    lowered = {str(k).lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except (TypeError, ValueError):
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


def classify_status(
    status: int | None,
    message: str,
    *,
    retry_after_s: float | None = None,
    code: str | None = None,
    auth_hint: str | None = None,
) -> ProviderError:
    """A ProviderError for an HTTP status: retryable for 408/429/5xx/529, fatal with a fix-it hint otherwise."""
    if status in RETRYABLE_STATUSES:
        return ProviderError(message, retryable=True, status=status, retry_after_s=retry_after_s, code=code)
    hint = FATAL_HINTS.get(status or 0)
    if status in (401, 403) and auth_hint:
        hint = f"{hint} ({auth_hint})"
    text = f"{message} — {hint}" if hint else message
    return ProviderError(text, retryable=False, status=status, code=code)
