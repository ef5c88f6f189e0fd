"""Classify what the google-genai SDK raises into retryable / fatal `ProviderError`s.

The SDK raises `ClientError` / `ServerError` with `.code` (HTTP status) and `.status` (the RPC
status name) both for HTTP errors and for an error object sent as a `data:` event inside a 200
stream; transport failures surface as the HTTP library's own exceptions (httpx or httpx2,
whichever the SDK picked). A 429 carries `Retry-After` as a header or Google's `RetryInfo.retryDelay`
in the error details; either becomes the retry countdown.
"""

from __future__ import annotations

import os
import re
from typing import Any

from google.genai import errors as genai_errors

from stepq.providers.base import ProviderError
from stepq.providers.errors import RETRYABLE_STATUSES, classify_status, parse_retry_after

KEY_VARS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
RETRYABLE_RPC = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "ABORTED"})
AUTH_HINT = (
    "AI Studio: set GOOGLE_API_KEY (or GEMINI_API_KEY) to a valid key; Vertex AI: set GOOGLE_CLOUD_PROJECT, "
    "GOOGLE_CLOUD_LOCATION and Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS)"
)
_CONTEXT = re.compile(r"(input token count|exceeds the maximum number of tokens|context (window|length))", re.I)
_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def _transport_classes() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeouts, other transport errors) from whichever HTTP libraries are installed."""
    timeouts: list[type[BaseException]] = [TimeoutError]
    transport: list[type[BaseException]] = [ConnectionError]
    for module_name in ("httpx", "httpx2"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        timeouts.append(module.TimeoutException)
        transport.append(module.TransportError)
    try:
        import requests

        timeouts.append(requests.exceptions.Timeout)
        transport.append(requests.exceptions.ConnectionError)
    except ImportError:
        pass
    try:
        from google.auth import exceptions as auth_exceptions

        transport.append(auth_exceptions.TransportError)
    except ImportError:
        pass
    return tuple(timeouts), tuple(transport)


_TIMEOUTS, _TRANSPORT = _transport_classes()


def scrub(text: str) -> str:
    """Remove any configured API key value from a message before it reaches events or logs."""
    for var in KEY_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 6:
            text = text.replace(value, "***")
            text = text.replace(value.strip(), "***")
    return text


def _retry_delay(details: Any) -> float | None:
    """Google's RetryInfo (`details[].retryDelay: "37s"`) from an error body."""
    error = details.get("error", details) if isinstance(details, dict) else None
    items = error.get("details") if isinstance(error, dict) else None
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("retryDelay"), str):
            match = _DELAY.match(item["retryDelay"])
            if match:
                return float(match.group(1))
    return None


def _is_auth(code: int | None, status: str | None, message: str, details: Any) -> bool:
    if code in (401, 403) or status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return True
    return "API_KEY_INVALID" in str(details) or "api key not valid" in message.lower()


def classify_api_error(exc: genai_errors.APIError) -> ProviderError:
    code = exc.code if isinstance(exc.code, int) else None
    status = exc.status if isinstance(exc.status, str) else None
    message = scrub(str(exc.message or "no message"))
    text = f"Gemini API error {code or '?'} {status or ''}: {message}".replace("  ", " ")
    headers = getattr(getattr(exc, "response", None), "headers", None)
    retry_after = parse_retry_after(dict(headers) if headers is not None else None)
    if retry_after is None:
        retry_after = _retry_delay(exc.details)
    if code in RETRYABLE_STATUSES or status in RETRYABLE_RPC:
        return ProviderError(text, retryable=True, status=code, retry_after_s=retry_after, code=status)
    if _is_auth(code, status, message, exc.details):
        return ProviderError(f"{text} — authentication failed ({AUTH_HINT})", retryable=False, status=code, code=status)
    if _CONTEXT.search(message):
        return ProviderError(
            f"{text} — the conversation is longer than the model's context window; "
            "shorten the prompt or tool results, or lower max_steps",
            retryable=False,
            status=code,
            code="context_length",
        )
    return classify_status(code, text, code=status, auth_hint=AUTH_HINT)


def classify(exc: BaseException) -> ProviderError:
    """Any exception from building the client or reading the stream -> a classified ProviderError."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, genai_errors.APIError):
        return classify_api_error(exc)
    if isinstance(exc, genai_errors.UnknownApiResponseError):
        return ProviderError("Gemini sent a response that is not valid JSON", retryable=True, code="bad_response")
    if isinstance(exc, _TIMEOUTS):
        return ProviderError(f"timed out talking to Gemini ({type(exc).__name__})", retryable=True, code="timeout")
    if isinstance(exc, _TRANSPORT):
        return ProviderError(
            f"connection to Gemini failed ({type(exc).__name__}: {scrub(str(exc))})", retryable=True, code="connection"
        )
    try:
        from google.auth import exceptions as auth_exceptions

        if isinstance(exc, auth_exceptions.GoogleAuthError):
            return ProviderError(
                f"Google credentials could not be loaded or refreshed ({type(exc).__name__}) — {AUTH_HINT}",
                retryable=False,
                code="auth",
            )
    except ImportError:
        pass
    return ProviderError(f"Gemini adapter failure: {type(exc).__name__}: {scrub(str(exc))}", retryable=False)
