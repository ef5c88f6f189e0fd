"""The `openai`, `openai-compatible` and `azure-openai` providers, through the official `openai` SDK.

One `stream_step` is one streamed call: the Responses API (`responses.create(stream=True)`, the default
for `openai`) or Chat Completions (`chat.completions.create(stream=True)`, the default for
`openai-compatible` servers such as vLLM, Ollama or a LiteLLM proxy, and for Azure OpenAI deployments);
`provider_options["api"]` picks the other. Requests are built by `openai_wire`, events read by
`openai_stream`. The SDK's own retries are off (`max_retries=0`): the engine's retry is the only one.

Clients: `openai` reads the SDK's standard environment (`OPENAI_API_KEY`, `OPENAI_BASE_URL`,
`OPENAI_ORG_ID`, `OPENAI_PROJECT_ID`). `openai-compatible` takes `base_url` from the agent's
`provider_options`, else `STEPQ_OPENAI_COMPATIBLE_BASE_URL`, else `OPENAI_BASE_URL`, and its key from the
variable named by `provider_options["api_key_env"]`, else `STEPQ_OPENAI_COMPATIBLE_API_KEY`, else
`OPENAI_API_KEY` (a server that needs none gets a placeholder). `azure-openai` is the SDK's `AzureOpenAI`
client (`AZURE_OPENAI_ENDPOINT`, `AZURE_OPENAI_API_KEY` or `AZURE_OPENAI_AD_TOKEN`, `OPENAI_API_VERSION`;
the model is the deployment name).

Per-agent knobs (`provider_options`): `api` (`responses` | `chat`), `stall_timeout_s` (default 60),
`connect_timeout_s` (default 10), `reasoning_effort`, `reasoning_summary` (Responses: `auto`, `concise`,
`detailed`), `strict` (strict JSON-schema answers), `store` (Responses, default false),
`disable_parallel_tool_use`, `max_tokens_param` (Chat: `max_tokens` or `max_completion_tokens`),
`base_url` / `api_key_env` / `file_parts` (openai-compatible: the server takes PDF `file` parts), `api_version`
(Azure).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import openai

from stepq.errors import SubmitError
from stepq.models import StepOutput, ToolSpec
from stepq.providers.base import AdapterAgent, Emit, ProviderAdapter, ProviderError, ShouldStop, StepRequest
from stepq.providers.loop_transport import loop_client
from stepq.providers.openai.raw_stream import EventsReader
from stepq.providers.openai.stream import ChatAccumulator, ResponsesAccumulator, classify_error, without_secrets
from stepq.providers.openai.wire import answers_with_schema, chat_params, responses_params
from stepq.providers.openai.wire import check_tools as _check_tools
from stepq.providers.raw_body import read_body

DEFAULT_STALL_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_CLIENT_CACHE_SIZE = 8
COMPATIBLE_URL_VAR = "STEPQ_OPENAI_COMPATIBLE_BASE_URL"
COMPATIBLE_KEY_VAR = "STEPQ_OPENAI_COMPATIBLE_API_KEY"
AZURE_VARS = ("AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN", "OPENAI_API_VERSION")


def check_configured() -> None:
    """`openai`: fail at submit (before any call) when no key is in the environment."""
    if not os.environ.get("OPENAI_API_KEY"):
        raise SubmitError(
            "provider 'openai' is not configured: set OPENAI_API_KEY in the environment of the producer and the "
            "workers; OPENAI_BASE_URL optionally points the SDK at another endpoint"
        )


def check_compatible_configured() -> None:
    """`openai-compatible`: the base URL may also come from the agent (checked when its adapter is made)."""


def check_azure_configured() -> None:
    if not os.environ.get("AZURE_OPENAI_ENDPOINT") or not (
        os.environ.get("AZURE_OPENAI_API_KEY") or os.environ.get("AZURE_OPENAI_AD_TOKEN")
    ):
        raise SubmitError(
            "provider 'azure-openai' is not configured: set AZURE_OPENAI_ENDPOINT and AZURE_OPENAI_API_KEY (or "
            "AZURE_OPENAI_AD_TOKEN), and OPENAI_API_VERSION, in the environment of the producer and the workers"
        )


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError when a tool cannot be declared to OpenAI."""
    _check_tools(specs)


# --------------------------------------------------------------------------- clients


_clients: OrderedDict[tuple[str, ...], Any] = OrderedDict()
_clients_lock = threading.Lock()


def _hashed(*values: str | None) -> tuple[str, ...]:
    """Cache-key material; credentials are hashed so the cache key never holds them."""
    return tuple(hashlib.sha256((v or "").encode()).hexdigest() for v in values)


def _cached(key: tuple[str, ...], make: Callable[[], Any]) -> Any:
    """One SDK client (and connection pool) per configuration, reused across steps and threads."""
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = make()
            while len(_clients) > _CLIENT_CACHE_SIZE:
                _clients.popitem(last=False)  # streams in flight keep their own reference
        else:
            _clients.move_to_end(key)
        return client


def new_client(sdk: Callable[..., Any], **options: Any) -> Any:
    """An SDK client with its retries off (the engine's retry is the only one), sending through the provider loop."""
    return sdk(max_retries=0, http_client=loop_client(openai.DefaultHttpxClient), **options)


def openai_client() -> Any:
    env = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID")
    return _cached(("openai", *_hashed(*(os.environ.get(n) for n in env))), lambda: new_client(openai.OpenAI))


def compatible_settings(options: dict[str, Any]) -> tuple[str | None, str]:
    """The base URL and key of an OpenAI-compatible server, per agent or from the environment."""
    base_url = options.get("base_url") or os.environ.get(COMPATIBLE_URL_VAR) or os.environ.get("OPENAI_BASE_URL")
    key_var = options.get("api_key_env")
    key = (
        (os.environ.get(str(key_var)) if key_var else None)
        or os.environ.get(COMPATIBLE_KEY_VAR)
        or os.environ.get("OPENAI_API_KEY")
        or "not-needed"  # the SDK insists on a key; local servers (Ollama, vLLM) ignore it
    )
    return (str(base_url) if base_url else None), key


def compatible_client(options: dict[str, Any]) -> Any:
    base_url, key = compatible_settings(options)
    return _cached(
        ("compatible", *_hashed(base_url, key)), lambda: new_client(openai.OpenAI, base_url=base_url, api_key=key)
    )


def azure_client(options: dict[str, Any]) -> Any:
    version = options.get("api_version") or os.environ.get("OPENAI_API_VERSION")
    key = ("azure", *_hashed(*(os.environ.get(n) for n in AZURE_VARS), str(version or "")))
    return _cached(key, lambda: new_client(openai.AzureOpenAI, api_version=version))


# --------------------------------------------------------------------------- the adapter


class OpenAIAdapter(ProviderAdapter):
    """One streamed call over any client with `.responses` / `.chat.completions` (OpenAI, compatible, Azure)."""

    name = "openai"
    sampling_fields = frozenset({"temperature", "top_p", "reasoning_effort"})  # no thinking budget on OpenAI
    tool_failure_breaker: int | None = None

    def __init__(
        self,
        model: str,
        client_factory: Callable[[], Any],
        api: str,
        label: str,
        auth_hint: str,
        secret_vars: tuple[str, ...] = (),
    ) -> None:
        self.model = model
        self.client_factory = client_factory
        self.api = api
        self.label = label
        self.auth_hint = auth_hint
        self.secret_vars = secret_vars  # variables whose values are masked in errors, besides the standard ones
        self.base_url: str | None = None  # an OpenAI-compatible server's (a tenant's key goes to the same one)

    def check_tools(self, tools: list[ToolSpec]) -> None:
        _check_tools(tools)

    def use_credential(self, api_key: str) -> None:
        if self.name not in ("openai", "openai-compatible"):  # Azure authenticates per deployment
            super().use_credential(api_key)
        base_url = self.base_url

        def keyed() -> Any:
            return _cached(
                ("tenant", *_hashed(base_url, api_key)),
                lambda: new_client(openai.OpenAI, base_url=base_url, api_key=api_key),
            )

        self.client_factory = keyed

    def is_malformed(self, output: StepOutput) -> bool:
        """A call whose arguments were not a JSON object earns one corrective retry."""
        return any(c.provider_data and "invalid_json" in c.provider_data for c in output.message.tool_calls)

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        options = request.options
        stall_s = float(options.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S))
        connect_s = float(options.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S))
        # the read timeout is the stall watchdog: no byte for stall_s -> retryable "stall"
        timeout = openai.Timeout(connect=connect_s, read=stall_s, write=max(stall_s, 30.0), pool=connect_s)
        schema_answer = answers_with_schema(request)
        acc: ResponsesAccumulator | ChatAccumulator
        if self.api == "chat":
            acc = ChatAccumulator(emit, schema_answer, request.step)
            params = chat_params(request)
        else:
            acc = ResponsesAccumulator(emit, schema_answer, request.step)
            params = responses_params(request)
        try:
            client = self.client_factory()
            endpoint = client.chat.completions if self.api == "chat" else client.responses
            # the SDK makes the request (auth, headers, status errors); the raw SSE is decoded here (raw_stream.py)
            with endpoint.with_streaming_response.create(stream=True, timeout=timeout, **params) as response:
                if read_body(response.http_response, EventsReader(acc, should_stop, self.label)):
                    return acc.output()
        except Exception as exc:
            if should_stop():  # cancelled (or the lease moved on) while the stream failed: keep what arrived
                return acc.output()
            error = without_secrets(classify_error(exc, stall_s, self.label, self.auth_hint), self.secret_vars)
            error.usage = error.usage or acc.reported_usage()
            raise error from exc
        if not acc.complete:
            raise ProviderError(
                f"the {self.label} stream ended before the response completed (connection closed early)",
                retryable=True,
                code="incomplete",
                usage=acc.reported_usage(),
            )
        return acc.output()


def create_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    check_configured()  # a worker without the key fails the turn clearly, without a call
    api = str(agent.provider_options.get("api", "responses"))
    return OpenAIAdapter(model, openai_client, api, "OpenAI", "set OPENAI_API_KEY to a valid key")


def create_compatible_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    options = dict(agent.provider_options)
    base_url, _ = compatible_settings(options)
    if not base_url:
        raise SubmitError(
            f"provider 'openai-compatible' needs the server's URL: set provider_options base_url on agent {agent.id}, "
            f"or {COMPATIBLE_URL_VAR} (or OPENAI_BASE_URL) in the environment"
        )
    adapter = OpenAIAdapter(
        model,
        lambda: compatible_client(options),
        str(options.get("api", "chat")),
        "the OpenAI-compatible server",
        f"set {COMPATIBLE_KEY_VAR} (or the variable named by provider_options api_key_env) to a valid key",
        secret_vars=(str(options["api_key_env"]),) if options.get("api_key_env") else (),
    )
    adapter.name = "openai-compatible"
    adapter.base_url = base_url
    return adapter


def create_azure_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    check_azure_configured()
    options = dict(agent.provider_options)
    if not (options.get("api_version") or os.environ.get("OPENAI_API_VERSION")):
        raise SubmitError(
            f"provider 'azure-openai' needs an API version: set OPENAI_API_VERSION, or provider_options api_version "
            f"on agent {agent.id}"
        )
    adapter = OpenAIAdapter(
        model,
        lambda: azure_client(options),
        str(options.get("api", "chat")),
        "Azure OpenAI",
        "set AZURE_OPENAI_API_KEY (or AZURE_OPENAI_AD_TOKEN) to a valid key",
    )
    adapter.name = "azure-openai"
    return adapter
