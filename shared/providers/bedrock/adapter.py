"""Amazon Bedrock over boto3 `bedrock-runtime` `converse_stream`.

The SDK's own retries are off (`total_max_attempts=1`: `max_attempts=1` still retries
once in standard mode), so the engine's retry is the only one. Endpoint, region and
credentials come from the SDK's standard environment (`AWS_ENDPOINT_URL_BEDROCK_RUNTIME`,
`AWS_REGION` / `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`... or `AWS_BEARER_TOKEN_BEDROCK`);
nothing here overrides them. Every failure is raised as a classified `ProviderError`.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions
from botocore.eventstream import ParserError

from stepq.errors import DefinitionError, SubmitError
from stepq.models import Delta, StepOutput, ToolSpec, Usage
from stepq.providers.base import BatchAPI, Emit, ProviderAdapter, ProviderError, ShouldStop, StepRequest
from stepq.providers.bedrock import wire as bedrock_wire
from stepq.providers.errors import classify_status, parse_retry_after

if TYPE_CHECKING:
    from stepq.agents.definition import AgentDefinition

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

_CLIENTS: dict[str, Any] = {}
_MAX_CLIENTS = 16
_CLIENTS_LOCK = threading.Lock()


# --------------------------------------------------------------------------- configuration


def _region(options: dict[str, Any] | None = None) -> str | None:
    """An agent's `region` option, else botocore's resolution (AWS_DEFAULT_REGION, profile), else AWS_REGION."""
    if options and options.get("region"):
        return str(options["region"])
    return boto3.session.Session().region_name or os.environ.get("AWS_REGION") or None


def _has_credentials() -> bool:
    if os.environ.get("AWS_BEARER_TOKEN_BEDROCK"):
        return True
    try:
        return boto3.session.Session().get_credentials() is not None
    except botocore.exceptions.BotoCoreError:
        return False


def check_configured() -> None:
    """Refuse a Bedrock turn before any call when the region or the credentials cannot be resolved."""
    if not _region():
        raise SubmitError("Bedrock is not configured: set AWS_REGION (or AWS_DEFAULT_REGION) to the model's region")
    if not _has_credentials():
        raise SubmitError(f"Bedrock has no credentials: {AUTH_HINT}")


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError for a tool Bedrock cannot declare (name rules, non-object schema)."""
    bedrock_wire.check_tools(specs)


def _timeouts(options: dict[str, Any]) -> tuple[float, float]:
    """(connect, read) seconds. The socket read timeout doubles as the stall watchdog: no bytes
    for `stall_timeout_s` (default 60) and the read fails, which we raise as a retryable stall."""
    connect = float(options.get("connect_timeout_s", 10))
    stall = float(options.get("stall_timeout_s", 60))
    read = min(float(options.get("read_timeout_s", stall)), stall)
    return connect, read


def _client(region: str, connect: float, read: float) -> Any:
    """A cached client per (environment, region, timeouts); boto3 clients are thread-safe."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    key = hashlib.sha256(repr((env, region, connect, read)).encode()).hexdigest()
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            if len(_CLIENTS) >= _MAX_CLIENTS:
                _CLIENTS.clear()  # the environment keeps changing (tests): don't hoard connection pools
            config = botocore.config.Config(
                region_name=region,
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=connect,
                read_timeout=read,
            )
            client = boto3.session.Session().client("bedrock-runtime", config=config)
            _CLIENTS[key] = client
        return client


# --------------------------------------------------------------------------- error classification


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


# --------------------------------------------------------------------------- the adapter


class _EmitFailed(Exception):
    """Carries an exception raised by `emit` past the provider-error classification."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class BedrockAdapter(ProviderAdapter):
    """One `converse_stream` call per step; blocks keyed by contentBlockIndex."""

    name = "bedrock"
    tool_failure_breaker: int | None = None  # Bedrock reports tool failures with `status: error`; no breaker

    def __init__(self, model: str, options: dict[str, Any] | None = None) -> None:
        self.model = model
        self.options = dict(options or {})
        self._malformed = False

    def check_tools(self, tools: list[ToolSpec]) -> None:
        bedrock_wire.check_tools(tools)

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        options = {**self.options, **request.options}
        try:
            bedrock_wire.check_tools(request.tools)
        except DefinitionError as exc:
            raise ProviderError(str(exc), retryable=False, status=400, code="invalid_tool") from None
        region = _region(options)
        if not region:
            raise ProviderError("Bedrock has no region: set AWS_REGION", retryable=False, code="config")
        connect, read = _timeouts(options)
        kwargs = bedrock_wire.build_request(request)
        assembler = bedrock_wire.StreamAssembler()
        stream = None
        stopped = False
        try:
            response = _client(region, connect, read).converse_stream(**kwargs)
            stream = response["stream"]
            for event in stream:
                deltas = assembler.on_event(event)
                try:
                    for kind, text in deltas:
                        emit(Delta(kind, text))  # type: ignore[arg-type]  # text | reasoning | object
                except Exception as exc:  # our own event log failed: not the provider's error to classify
                    raise _EmitFailed(exc) from exc
                if should_stop():
                    stopped = True
                    break
        except _EmitFailed as failed:
            raise failed.cause from None
        except Exception as exc:
            error = classify_exception(exc, read)
            error.usage = error.usage or _reported_usage(assembler)  # billed although the call failed
            raise error from None
        finally:
            if stream is not None:
                stream.close()
        if assembler.raw_stop is None and not stopped:
            raise ProviderError(
                "the Bedrock stream ended without messageStop (truncated response)",
                retryable=True,
                code="incomplete_stream",
                usage=_reported_usage(assembler),
            )
        message = assembler.message()
        self._malformed = assembler.malformed
        raw = assembler.raw_stop
        return StepOutput(
            message=message,
            usage=assembler.usage,
            raw_finish_reason=raw,
            finish_reason=bedrock_wire.map_finish_reason(raw, bool(message.tool_calls)),
        )

    def is_malformed(self, output: StepOutput) -> bool:
        return self._malformed or output.raw_finish_reason in bedrock_wire.MALFORMED_STOPS

    def batch_api(self) -> BatchAPI | None:
        """Batch inference for Claude models, once a bucket and a role are configured (else None: online)."""
        from stepq.providers.bedrock import batch as bedrock_batch

        if not bedrock_batch.configured(self.model):
            return None
        return bedrock_batch.BedrockBatchAPI(self.model, _region(self.options))

    def malformed_note(self) -> str:
        return "Your last tool call was malformed. Call the tool again with a valid JSON object as its input."


def _reported_usage(assembler: bedrock_wire.StreamAssembler) -> Usage | None:
    """The usage a `metadata` event reported before the call failed (the engine counts it), else None."""
    usage = assembler.usage
    reported = usage.total_tokens or usage.cache_read_tokens or usage.cache_write_tokens
    return usage if reported else None


def create_adapter(agent: AgentDefinition, model: str) -> ProviderAdapter:
    return BedrockAdapter(model, agent.provider_options)
