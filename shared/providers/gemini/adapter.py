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

import queue
import threading
import time
from typing import Any

from google import genai
from google.genai import types

from stepq.models import StepOutput, ToolSpec
from stepq.providers.base import (
    AdapterAgent,
    BatchAPI,
    Emit,
    ProviderAdapter,
    ProviderError,
    ShouldStop,
    StepRequest,
)
from stepq.providers.gemini import schema as gemini_schema
from stepq.providers.gemini.batch import GeminiBatchAPI
from stepq.providers.gemini.client import DEFAULT_STALL_S, answers_with_schema, build_config, get_client, uses_vertex
from stepq.providers.gemini.client import check_configured as check_configured  # the registry's config check
from stepq.providers.gemini.errors import classify
from stepq.providers.gemini.wire import PROVIDER, StreamParser, to_contents

DEFAULT_TOOL_MAX_RETRIES = 2  # Gemini tends to repeat a failing call: the failure-strike breaker is on
MALFORMED_FINISH = "MALFORMED_FUNCTION_CALL"
MALFORMED_NOTE = "Your previous function call was malformed. Please retry with valid arguments."
_POLL_S = 0.1  # how often a silent stream re-checks should_stop()


# --------------------------------------------------------------------------- tools


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError when a tool's name or input schema cannot be expressed for Gemini."""
    gemini_schema.check_tools(specs)


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


def create_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    return GeminiAdapter(model)
