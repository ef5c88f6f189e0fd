"""The Gemini adapter (google-genai; AI Studio and Vertex AI).

One `stream_step` = one `generate_content_stream` call through the official SDK's sync client,
configured only by the SDK's standard environment (`GOOGLE_API_KEY` / `GEMINI_API_KEY`,
`GOOGLE_GEMINI_BASE_URL`; or `GOOGLE_GENAI_USE_VERTEXAI` + `GOOGLE_CLOUD_PROJECT` +
`GOOGLE_CLOUD_LOCATION`, `GOOGLE_VERTEX_BASE_URL`). The SDK's retries are off (`attempts=1`): the
engine's retry is the only one.

The stream is read on a helper thread that hands chunks over a queue, so the step thread can
enforce a stall watchdog (no chunk for `stall_timeout_s`) and notice `should_stop()` even while
the upstream is silent. Clients are cached per environment so connections and Vertex access
tokens are reused across steps; the step keeps its own reference while it reads.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from google import genai
from google.genai import types

from stepq.errors import DefinitionError, SubmitError
from stepq.models import StepOutput, ToolSpec
from stepq.providers.base import OUTPUT_TOOL, BatchAPI, Emit, ProviderAdapter, ProviderError, ShouldStop, StepRequest
from stepq.providers.gemini import schema as gemini_schema
from stepq.providers.gemini.errors import classify
from stepq.providers.gemini.wire import PROVIDER, StreamParser, to_contents

if TYPE_CHECKING:
    from stepq.agents.definition import AgentDefinition

DEFAULT_TOOL_MAX_RETRIES = 2  # Gemini tends to repeat a failing call: the failure-strike breaker is on
MALFORMED_FINISH = "MALFORMED_FUNCTION_CALL"
MALFORMED_NOTE = "Your previous function call was malformed. Please retry with valid arguments."
DEFAULT_STALL_S = 60.0
DEFAULT_REQUEST_TIMEOUT_S = 600.0
_POLL_S = 0.1  # how often a silent stream re-checks should_stop()
_ENV = (
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_ENTERPRISE",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_VERTEX_BASE_URL",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_GENAI_API_VERSION",
)


# --------------------------------------------------------------------------- configuration


def _flag(name: str) -> bool | None:
    value = os.environ.get(name)
    return None if value is None else value.strip().lower() in ("true", "1")


def uses_vertex() -> bool:
    """The SDK's own rule: GOOGLE_GENAI_USE_ENTERPRISE wins over GOOGLE_GENAI_USE_VERTEXAI."""
    enterprise = _flag("GOOGLE_GENAI_USE_ENTERPRISE")
    return bool(enterprise if enterprise is not None else _flag("GOOGLE_GENAI_USE_VERTEXAI"))


def _has_key() -> bool:
    return any(os.environ.get(v, "").strip() for v in ("GOOGLE_API_KEY", "GEMINI_API_KEY"))


def check_configured() -> None:
    """Raise SubmitError naming the variables to set when neither AI Studio nor Vertex is configured."""
    if uses_vertex():
        if not os.environ.get("GOOGLE_CLOUD_PROJECT", "").strip() and not _has_key():
            raise SubmitError(
                "Gemini on Vertex AI is not configured: set GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION "
                "(with Application Default Credentials, e.g. GOOGLE_APPLICATION_CREDENTIALS), "
                "or GOOGLE_API_KEY for Vertex express mode"
            )
        return
    if not _has_key():
        raise SubmitError(
            "Gemini is not configured: set GOOGLE_API_KEY (or GEMINI_API_KEY) for AI Studio, or "
            "GOOGLE_GENAI_USE_VERTEXAI=true with GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION for Vertex AI"
        )


_CLIENTS: OrderedDict[str, genai.Client] = OrderedDict()
_CLIENTS_LOCK = threading.Lock()
_MAX_CLIENTS = 8


def _new_client() -> genai.Client:
    http_options = types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=1))
    if uses_vertex():
        project = os.environ.get("GOOGLE_CLOUD_PROJECT", "").strip()
        if project:
            # explicit project/location: with GOOGLE_VERTEX_BASE_URL and env-only values the SDK would
            # post to the bare base URL ("gateway" mode). The base URL itself still comes from the env.
            location = os.environ.get("GOOGLE_CLOUD_LOCATION", "").strip() or "global"
            return genai.Client(vertexai=True, project=project, location=location, http_options=http_options)
        return genai.Client(vertexai=True, http_options=http_options)  # express mode: API key from the env
    return genai.Client(http_options=http_options)


def get_client() -> genai.Client:
    """A client for the current environment, shared across steps (reuses connections and tokens)."""
    fingerprint = hashlib.sha256("\0".join(os.environ.get(v, "") for v in _ENV).encode()).hexdigest()
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(fingerprint)
        if client is not None:
            _CLIENTS.move_to_end(fingerprint)
            return client
    client = _new_client()
    with _CLIENTS_LOCK:
        _CLIENTS[fingerprint] = client
        while len(_CLIENTS) > _MAX_CLIENTS:
            _CLIENTS.popitem(last=False)  # a step still reading holds its own reference
    return client


# --------------------------------------------------------------------------- tools


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError when a tool's name or input schema cannot be expressed for Gemini."""
    gemini_schema.check_tools(specs)


def _tool_config(choice: str | None, names: dict[str, str]) -> types.ToolConfig | None:
    if choice is None or not names:
        return None
    mode = types.FunctionCallingConfigMode
    modes = {"auto": mode.AUTO, "none": mode.NONE, "required": mode.ANY}
    if choice in modes:
        return types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode=modes[choice]))
    wire = gemini_schema.wire_name(choice)
    return types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode=mode.ANY, allowed_function_names=[wire])
    )


def _thinking(options: dict[str, Any]) -> types.ThinkingConfig | None:
    budget, level = options.get("thinking_budget"), options.get("thinking_level")
    include = options.get("include_thoughts")
    if budget is None and level is None and include is None:
        return None
    return types.ThinkingConfig(
        include_thoughts=True if include is None else bool(include),
        thinking_budget=budget,
        thinking_level=level,
    )


def build_config(request: StepRequest, system: list[str]) -> types.GenerateContentConfig:
    """The GenerateContentConfig for one step (tools, limits, thinking, per-request timeouts)."""
    options = request.options
    declarations = []
    json_answer = answers_with_schema(request)
    for spec in [] if json_answer else request.tools:
        try:
            declarations.append(types.FunctionDeclaration.model_validate(gemini_schema.function_declaration(spec)))
        except DefinitionError as exc:
            raise ProviderError(str(exc), retryable=False, code="tool_schema") from None
    names = {gemini_schema.wire_name(t.name): t.name for t in request.tools}
    stall = float(options.get("stall_timeout_s", DEFAULT_STALL_S))
    first = float(options.get("first_chunk_timeout_s", stall))
    read_timeout_s = max(stall, first) + 5.0  # the socket gives up just after our watchdog would
    server_timeout_s = float(options.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S))
    config = types.GenerateContentConfig(
        system_instruction="\n\n".join(system) if system else None,
        tools=[types.Tool(function_declarations=declarations)] if declarations else None,
        tool_config=None if json_answer else _tool_config(request.tool_choice, names),
        max_output_tokens=request.max_tokens,
        temperature=request.temperature,
        stop_sequences=request.stop_sequences or None,
        top_p=options.get("top_p"),
        top_k=options.get("top_k"),
        seed=options.get("seed"),
        thinking_config=_thinking(options),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        http_options=types.HttpOptions(
            timeout=int(read_timeout_s * 1000),
            headers={"X-Server-Timeout": str(int(server_timeout_s))},  # else the SDK sends the socket timeout
        ),
    )
    if request.output_schema is not None and not declarations:
        config.response_mime_type = "application/json"
        config.response_json_schema = request.output_schema
    return config


def answers_with_schema(request: StepRequest) -> bool:
    """A forced structured answer goes out as Gemini's response schema + JSON output, not a function call
    (Gemini does not take function calling and a JSON response schema together)."""
    return request.output_schema is not None and request.tool_choice == OUTPUT_TOOL


# --------------------------------------------------------------------------- the adapter


class _Pump:
    """Reads the SDK stream on its own thread; the step thread takes chunks from `items`."""

    def __init__(self, client: genai.Client, model: str, contents: list[types.Content], config: Any) -> None:
        self.client = client  # held for the stream's whole life: a collected client closes its HTTP pool
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.abandoned = threading.Event()
        self._args = (model, contents, config)
        self._thread = threading.Thread(target=self._run, name="stepq-gemini-stream", daemon=True)

    def start(self) -> _Pump:
        self._thread.start()
        return self

    def _run(self) -> None:
        model, contents, config = self._args
        stream: Any = None
        try:
            stream = self.client.models.generate_content_stream(model=model, contents=contents, config=config)
            for chunk in stream:
                if self.abandoned.is_set():
                    break
                self.items.put(("chunk", chunk))
            self.items.put(("end", None))
        except BaseException as exc:  # handed to the step thread, which classifies it
            self.items.put(("error", exc))
        finally:
            if stream is not None and hasattr(stream, "close"):
                stream.close()  # an abandoned stream releases its connection now, not at GC


class GeminiAdapter(ProviderAdapter):
    name = PROVIDER
    tool_failure_breaker: int | None = DEFAULT_TOOL_MAX_RETRIES

    def __init__(self, model: str) -> None:
        self.model = model

    def check_tools(self, tools: list[ToolSpec]) -> None:
        check_tools(tools)

    def is_malformed(self, output: StepOutput) -> bool:
        return output.raw_finish_reason == MALFORMED_FINISH

    def batch_api(self) -> BatchAPI | None:
        """Batch mode with inlined requests (AI Studio); Vertex batches read from GCS/BigQuery: not supported."""
        if uses_vertex():
            return None
        from stepq.providers.gemini.batch import GeminiBatchAPI  # it imports this module's request builders

        return GeminiBatchAPI(self.model)

    def malformed_note(self) -> str:
        return MALFORMED_NOTE

    def count_tokens(self, request: StepRequest) -> int | None:
        """`models.count_tokens`. Vertex counts the system instruction and tools too; the Gemini API counts
        only contents (its SDK refuses the rest), so those are added at 4 characters a token."""
        contents, system_in_transcript = to_contents(request.messages)
        system = [request.system] if request.system else []
        config = build_config(request, system + system_in_transcript)
        try:
            client = get_client()
            if client.vertexai:
                tools = [t for t in config.tools or [] if isinstance(t, types.Tool)]
                counted = types.CountTokensConfig(system_instruction=config.system_instruction, tools=tools or None)
                result = client.models.count_tokens(model=request.model, contents=contents, config=counted)
                return int(result.total_tokens or 0)
            result = client.models.count_tokens(model=request.model, contents=contents)
        except Exception as exc:
            raise classify(exc) from exc
        rest = sum(len(text) for text in system + system_in_transcript)
        rest += sum(len(t.model_dump_json()) for t in request.tools)
        return int(result.total_tokens or 0) + rest // 4

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        contents, system_in_transcript = to_contents(request.messages)
        system = [request.system] if request.system else []
        config = build_config(request, system + system_in_transcript)
        names = {gemini_schema.wire_name(t.name): t.name for t in request.tools}
        parser = StreamParser(request.step, names, emit, text_kind="object" if answers_with_schema(request) else "text")
        try:
            client = get_client()
        except Exception as exc:
            raise classify(exc) from None
        stall = float(request.options.get("stall_timeout_s", DEFAULT_STALL_S))
        first = float(request.options.get("first_chunk_timeout_s", stall))
        pump = _Pump(client, request.model, contents, config).start()
        try:
            ended = self._drain(pump, parser, should_stop, first, stall)
            if ended and parser.raw_finish is None:
                raise ProviderError(
                    "the Gemini stream ended without a finishReason (connection closed early)",
                    retryable=True,
                    code="incomplete",
                )
        except ProviderError as exc:  # usageMetadata that arrived before the failure is billed: report it
            if parser.usage_meta is not None:
                exc.usage = parser.usage()
            raise
        finally:
            pump.abandoned.set()
        return parser.output()

    @staticmethod
    def _drain(pump: _Pump, parser: StreamParser, should_stop: ShouldStop, first: float, stall: float) -> bool:
        """Feed the parser until the stream ends (True) or the step is told to stop (False)."""
        last = time.monotonic()
        limit = first
        while True:
            if should_stop():
                return False
            waited = time.monotonic() - last
            if waited >= limit:
                raise ProviderError(
                    f"Gemini sent nothing for {limit:g}s (stall watchdog; raise provider_options.stall_timeout_s "
                    "for slow models)",
                    retryable=True,
                    code="stall",
                )
            try:
                kind, item = pump.items.get(timeout=min(limit - waited, _POLL_S))
            except queue.Empty:
                continue
            if kind == "end":
                return True
            if kind == "error":
                raise classify(item) from None
            parser.feed(item)
            last, limit = time.monotonic(), stall


def create_adapter(agent: AgentDefinition, model: str) -> ProviderAdapter:
    return GeminiAdapter(model)
