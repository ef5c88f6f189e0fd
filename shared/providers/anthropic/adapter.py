"""The `anthropic` provider: Anthropic Messages streaming through the official SDK.

One `stream_step` is one `messages.create(stream=True)` call read event by event
(`anthropic_stream`), built from the canonical transcript (`anthropic_wire`). The
SDK's own retries are off (`max_retries=0`): the engine's retry is the only one.
The SDK reads its standard environment (`ANTHROPIC_API_KEY` / `ANTHROPIC_AUTH_TOKEN`,
`ANTHROPIC_BASE_URL`); nothing here overrides it. The SDK's own OpenTelemetry spans are off
(`sdk_spans_off`): stepq emits each model call's span itself, once its step commits.

Per-agent knobs (`provider_options`): `thinking_budget` (extended thinking),
`thinking` (a raw thinking config), `cache` (default true) and `cache_ttl`,
`stall_timeout_s` (default 60), `connect_timeout_s` (default 10),
`disable_parallel_tool_use`, `betas` (anthropic-beta header values).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import anthropic
import httpx2

from stepq.errors import SubmitError
from stepq.models import StepOutput, ToolSpec
from stepq.providers.anthropic.batch import AnthropicBatchAPI
from stepq.providers.anthropic.raw_stream import MessagesReader
from stepq.providers.anthropic.stream import AUTH_HINT, CREDENTIAL_VARS, StreamAccumulator, classify_error
from stepq.providers.anthropic.wire import build_params
from stepq.providers.anthropic.wire import check_tools as _check_tools
from stepq.providers.base import AdapterAgent, BatchAPI, Emit, ProviderAdapter, ProviderError, ShouldStop, StepRequest
from stepq.providers.loop_transport import loop_client
from stepq.providers.raw_body import read_body

DEFAULT_STALL_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_CLIENT_CACHE_SIZE = 8


def check_configured() -> None:
    """Fail at submit (before any call) when no Anthropic credential is in the environment."""
    if not any(os.environ.get(name) for name in (*CREDENTIAL_VARS, "ANTHROPIC_PROFILE")):
        raise SubmitError(
            "provider 'anthropic' is not configured: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN for a bearer "
            "token) in the environment of the producer and the workers; ANTHROPIC_BASE_URL optionally points the "
            "SDK at another endpoint"
        )


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError when a tool cannot be declared to Anthropic."""
    _check_tools(specs)


# --------------------------------------------------------------------------- clients


_clients: OrderedDict[tuple[str, ...], anthropic.Anthropic] = OrderedDict()
_clients_lock = threading.Lock()


def _env_fingerprint() -> tuple[str, ...]:
    """What the SDK reads from the environment at construction; a change means a new client.
    Credentials are hashed so the cache key never holds them."""
    names = ("ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS", *CREDENTIAL_VARS, "ANTHROPIC_PROFILE")
    return tuple(hashlib.sha256(os.environ.get(n, "").encode()).hexdigest() for n in names)


_SDK_TRACES_ITS_CALLS = "open_telemetry" in inspect.signature(anthropic.Anthropic.__init__).parameters


def sdk_spans_off() -> dict[str, Any]:
    """The client option that turns off the SDK's tracing of its own API calls (anthropic 2.x traces each call
    through OpenTelemetry's global tracer provider and sends its trace context with the request). stepq emits the
    model call's span itself once the step commits (engine/otel_spans.py): the SDK's would be a second span of
    the same call, emitted by every run of a step (a crashed one's too), and its `traceparent` a trace no caller
    started. Off also spares each call the span's attributes when no tracer records them. Empty for an SDK
    without the option; a new dict per client, which the SDK may keep."""
    if not _SDK_TRACES_ITS_CALLS:
        return {}
    return {"open_telemetry": {"traces": {"enabled": False}, "propagation": False}}


def new_client(**options: Any) -> anthropic.Anthropic:
    """An SDK client with its retries and its own spans off (the engine's retry and spans are the only ones),
    sending through the provider loop."""
    return anthropic.Anthropic(
        max_retries=0, http_client=loop_client(anthropic.DefaultHttpxClient), **sdk_spans_off(), **options
    )


def shared_client() -> anthropic.Anthropic:
    """One SDK client (and connection pool) per environment, reused across steps and threads."""
    key = _env_fingerprint()
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = new_client()
            _clients[key] = client
            while len(_clients) > _CLIENT_CACHE_SIZE:
                _clients.popitem(last=False)  # streams in flight keep their own reference
        else:
            _clients.move_to_end(key)
        return client


def keyed_client(api_key: str) -> anthropic.Anthropic:
    """A client that sends a tenant's own key (`x-api-key`), one per key; the cache key is the key's hash."""
    key = ("tenant", hashlib.sha256(api_key.encode()).hexdigest(), *_env_fingerprint())
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = new_client(api_key=api_key, auth_token=None)
            _clients[key] = client
            while len(_clients) > _CLIENT_CACHE_SIZE:
                _clients.popitem(last=False)
        else:
            _clients.move_to_end(key)
        return client


# --------------------------------------------------------------------------- the adapter


class AnthropicAdapter(ProviderAdapter):
    """Messages streaming over any SDK client with `.messages.create` (native, or a platform client)."""

    name = "anthropic"
    sampling_fields = frozenset({"reasoning_effort", "thinking_budget"})  # the Messages API has no temperature
    tool_failure_breaker: int | None = None  # the Anthropic API itself needs no failure breaker
    label = "Anthropic"
    auth_hint = AUTH_HINT

    def __init__(self, model: str, client_factory: Callable[[], Any] | None = None) -> None:
        self.model = model
        self.client_factory = client_factory or shared_client

    def classify(self, exc: BaseException, stall_s: float) -> ProviderError:
        return classify_error(exc, stall_s, self.label, self.auth_hint)

    def use_credential(self, api_key: str) -> None:
        if self.name != "anthropic":  # a platform client (Vertex) authenticates otherwise
            super().use_credential(api_key)
        self.client_factory = lambda: keyed_client(api_key)

    def check_tools(self, tools: list[ToolSpec]) -> None:
        _check_tools(tools)

    def batch_api(self) -> BatchAPI | None:
        """Message Batches (half price); a platform client (Vertex) has none."""
        return AnthropicBatchAPI(self.client_factory, self.label, self.auth_hint) if self.name == "anthropic" else None

    def is_malformed(self, output: StepOutput) -> bool:
        """A tool call whose input was not a JSON object earns one corrective retry."""
        return any(c.provider_data and "invalid_json" in c.provider_data for c in output.message.tool_calls)

    def count_tokens(self, request: StepRequest) -> int | None:
        """`messages.count_tokens` on the request the step would send (system, tools and thinking included)."""
        params = build_params(request)
        counted = {
            k: params[k] for k in ("model", "messages", "system", "tools", "tool_choice", "thinking") if k in params
        }
        try:
            return int(cast(Any, self.client_factory().messages).count_tokens(**counted).input_tokens)
        except Exception as exc:
            raise self.classify(exc, DEFAULT_STALL_TIMEOUT_S) from exc

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        options = request.options
        stall_s = float(options.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S))
        connect_s = float(options.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S))
        params = build_params(request)
        # the read timeout is the stall watchdog: no byte (event or ping) for stall_s -> retryable "stall"
        params["timeout"] = httpx2.Timeout(connect=connect_s, read=stall_s, write=max(stall_s, 30.0), pool=connect_s)
        acc = StreamAccumulator(emit)
        try:
            messages = cast(Any, self.client_factory().messages)
            # The SDK makes the request (auth, headers, status errors); the raw SSE bytes are decoded here
            # (raw_stream.py): the SDK's per-event decoding was most of a streamed delta's CPU (docs/benchmarks.md)
            with messages.with_streaming_response.create(stream=True, **params) as response:
                reader = MessagesReader(acc, should_stop, self.label, self.auth_hint)
                if read_body(response.http_response, reader):
                    return acc.output()
        except Exception as exc:
            if should_stop():  # cancelled (or the lease moved on) while the stream failed: keep what arrived
                return acc.output()
            error = self.classify(exc, stall_s)
            error.usage = acc.reported_usage()  # message_start's input tokens are billed even if the call fails
            raise error from exc
        if not acc.complete:
            raise ProviderError(
                f"the {self.label} stream ended before message_stop (connection closed early)",
                retryable=True,
                code="incomplete",
                usage=acc.reported_usage(),
            )
        return acc.output()


def create_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    check_configured()  # a worker without the key fails the turn clearly, without a call
    return AnthropicAdapter(model)
