"""Bedrock failures -> classified `ProviderError`s: HTTP error codes, in-stream exceptions, botocore's and
urllib3's own exceptions. Shared by the streamed adapter (`adapter`) and batch inference (`batch`), so
neither imports the other for it.
"""

from __future__ import annotations

import socket
from typing import Any

import botocore.exceptions
import urllib3.exceptions
from botocore.eventstream import ParserError

from stepq.providers.base import ProviderError
from stepq.providers.errors import classify_status, parse_retry_after

AUTH_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary credentials), "
    "AWS_PROFILE, or AWS_BEARER_TOKEN_BEDROCK"
)
# HTTP error codes (PascalCase) and in-stream exception types (lowerCamel) that a later attempt may clear
_RETRYABLE_CODES = {
    "throttlingexception": 429,
    "servicequotaexceededexception": 429,
    "toomanyrequestsexception": 429,
    "serviceunavailableexception": 503,
    "internalserverexception": 500,
    "modelstreamerrorexception": None,
    "modelnotreadyexception": 503,
    "modeltimeoutexception": 408,
    "requesttimeout": 408,
    "requesttimeoutexception": 408,
}
_AUTH_CODES = {
    "accessdeniedexception",
    "unrecognizedclientexception",
    "invalidsignatureexception",
    "expiredtokenexception",
    "signaturedoesnotmatch",
    "incompletesignature",
    "missingauthenticationtoken",
}
_CONTEXT_MARKERS = (
    "too long",
    "too many input tokens",
    "too many tokens",
    "context length",
    "context window",
    "maximum context",
    "exceeds the maximum number of tokens",
)


def _is_context_length(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def classify_client_error(exc: botocore.exceptions.ClientError) -> ProviderError:
    """HTTP errors (PascalCase codes) and in-stream exceptions (EventStreamError, lowerCamel codes)."""
    response: dict[str, Any] = dict(exc.response or {})
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    message = str(error.get("Message") or "") or code or "Bedrock error"
    meta = response.get("ResponseMetadata") or {}
    in_stream = isinstance(exc, botocore.exceptions.EventStreamError)
    status: int | None = None if in_stream else meta.get("HTTPStatusCode")
    retry_after = parse_retry_after(meta.get("HTTPHeaders"))
    lowered = code.lower()
    where = "Bedrock stream error" if in_stream else "Bedrock error"
    text = f"{where} {code}: {message}" if code else f"{where}: {message}"
    if lowered == "validationexception" and _is_context_length(message):
        return ProviderError(
            f"{text} — the conversation exceeds the model's context window; shorten the prompt or tool "
            "results, lower max_output_tokens, or use a model with a longer context",
            retryable=False,
            status=status,
            code="context_length",
        )
    if lowered in _RETRYABLE_CODES:
        return ProviderError(
            text,
            retryable=True,
            status=status or _RETRYABLE_CODES[lowered],
            retry_after_s=retry_after,
            code=code,
        )
    if lowered in _AUTH_CODES:
        return ProviderError(
            f"{text} — Bedrock refused the credentials or this model for them ({AUTH_HINT}; check the IAM "
            "policy allows bedrock:InvokeModelWithResponseStream and the model access is enabled)",
            retryable=False,
            status=status or 403,
            code=code,
        )
    if lowered == "resourcenotfoundexception":
        return ProviderError(
            f"{text} — the model id was not found in this region; check default_model and AWS_REGION",
            retryable=False,
            status=status or 404,
            code=code,
        )
    if in_stream and status is None:
        return ProviderError(f"{text} — the request was rejected", retryable=False, code=code)
    return classify_status(status, text, retry_after_s=retry_after, code=code or None, auth_hint=AUTH_HINT)


def classify_exception(exc: BaseException, read_timeout: float) -> ProviderError:
    """Any failure around the call or the stream -> a classified ProviderError."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        return classify_client_error(exc)
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return ProviderError(f"Bedrock has no usable credentials: {AUTH_HINT}", retryable=False, code="auth")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return ProviderError("Bedrock has no region: set AWS_REGION", retryable=False, code="config")
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        return ProviderError(
            f"the Bedrock request is invalid: {exc} — check tool schemas and inference parameters",
            retryable=False,
            status=400,
            code="invalid_request",
        )
    if isinstance(exc, botocore.exceptions.ConnectTimeoutError):
        return ProviderError(f"connecting to Bedrock timed out: {exc}", retryable=True, code="timeout")
    timeouts = (
        botocore.exceptions.ReadTimeoutError,
        urllib3.exceptions.ReadTimeoutError,
        socket.timeout,
        TimeoutError,
    )
    if isinstance(exc, timeouts):
        return ProviderError(
            f"no data from Bedrock for {read_timeout:g}s (stall_timeout_s); the stream stalled",
            retryable=True,
            code="stall",
        )
    connection = (
        botocore.exceptions.EndpointConnectionError,
        botocore.exceptions.ConnectionClosedError,
        botocore.exceptions.ConnectionError,
        botocore.exceptions.HTTPClientError,
        urllib3.exceptions.HTTPError,
        ConnectionError,
        OSError,
    )
    if isinstance(exc, connection):
        return ProviderError(
            f"connection to Bedrock failed: {type(exc).__name__}: {exc}", retryable=True, code="connection"
        )
    if isinstance(exc, ParserError):
        return ProviderError(f"the Bedrock event stream was corrupt: {exc}", retryable=True, code="stream_corrupt")
    return ProviderError(f"Bedrock call failed: {type(exc).__name__}: {exc}", retryable=False)
