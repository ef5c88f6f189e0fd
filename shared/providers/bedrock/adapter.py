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
import threading
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from stepq.errors import DefinitionError, SubmitError
from stepq.models import StepOutput, ToolSpec, Usage
from stepq.providers.base import AdapterAgent, BatchAPI, Emit, ProviderAdapter, ProviderError, ShouldStop, StepRequest
from stepq.providers.bedrock import wire as bedrock_wire
from stepq.providers.bedrock.errors import AUTH_HINT, classify_exception

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


# --------------------------------------------------------------------------- the adapter


class _EmitFailed(Exception):
    """Carries an exception raised by `emit` past the provider-error classification."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class BedrockAdapter(ProviderAdapter):
    """One `converse_stream` call per step; blocks keyed by contentBlockIndex."""

    name = "bedrock"
    sampling_fields = frozenset({"temperature", "top_p", "thinking_budget"})  # thinking: Claude's own field
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
                    for delta in deltas:
                        emit(delta)
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
        # lazy: batch inference reuses the anthropic adapter's wire, which needs the anthropic SDK (not in [bedrock])
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


def create_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    return BedrockAdapter(model, agent.provider_options)
