"""OpenTelemetry traces in the GenAI semantic conventions, built from what each committed step stored.

An observer of the lifecycle points (engine/lifecycle.py), on only when the `otel` extra is installed and
the standard variables ask for an exporter (`OTEL_TRACES_EXPORTER=otlp|console`, or an
`OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT`); `none`, `OTEL_SDK_DISABLED=true` or nothing set: off, and no
OpenTelemetry module is even imported. Service name, resource attributes, sampler, batch delays and the
OTLP endpoint are the SDK's own `OTEL_*` variables.

No span stays open across processes or time. Each span is emitted once its step's commit made it final,
with the stored start and end times and ids derived from (turn, step, attempt | tool call): the trace id
is the submitted `traceparent`'s (else one derived from the turn id), the turn's `invoke_agent` span has an
id every step span names as its parent from the start, and it is emitted itself when the turn ends. So a
turn parked for an hour and resumed on another worker is one trace, and a step re-run after its worker
died (only the run that commits emits) is one step span, marked `stepq.step.rerun=true`.

  invoke_agent {agent}         the turn: agent, thread, status, finish reason, total usage and cost
    step {n}                   one per step (stepq.*)
      chat {model}             one per model attempt: provider, models, usage, finish reasons, error.type
      execute_tool {tool}      one per tool call: name, call id, outcome, duration
      wait {approval|tool results}   a parked step's wait
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from typing import Any

from stepq.engine.context import Delivery, StepContext
from stepq.logging import Redactor, secret_values
from stepq.models import (
    AssistantMessage,
    AttemptTrace,
    StepTrace,
    ToolCallTrace,
    ToolResult,
    ToolResultStatus,
    TurnResult,
    TurnState,
    TurnStatus,
)
from stepq.providers.base import StepRequest
from stepq.turns import trace_context

log = logging.getLogger("stepq.otel")

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# stepq's provider names as `gen_ai.provider.name` values (the conventions' well-known ones)
PROVIDER_NAMES = {
    "anthropic": "anthropic",
    "anthropic-vertex": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "bedrock": "aws.bedrock",
    "openai": "openai",
}
_OK = {ToolResultStatus.OK}


def wanted(environ: os._Environ[str] | dict[str, str] = os.environ) -> list[str]:
    """The exporters the standard variables ask for (empty: tracing off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not names:  # the spec's default is `otlp`; stepq stays off unless an endpoint says where
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    return [n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"]


def from_environment() -> SpanExporter | None:
    """The process's exporter when the environment asks for one and the `otel` extra is installed."""
    names = wanted()
    if not names:
        return None
    try:
        provider, ids = _tracer_provider(names)
    except ImportError as exc:
        log.warning("OTEL_TRACES_EXPORTER asks for traces, but stepq[otel] is not installed (%s): no spans", exc)
        return None
    except Exception as exc:  # a bad exporter name or sampler: say so once, run without traces
        log.warning("OpenTelemetry tracing not started: %s", exc)
        return None
    return SpanExporter(provider, ids)


class _PresetIds:
    """The ids of the span about to start (and a root's trace id), per thread; the SDK's id generator
    (`_id_generator`) hands them out."""

    def __init__(self) -> None:
        self.next = threading.local()


def _id_generator(ids: _PresetIds) -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class PresetIdGenerator(IdGenerator):
        def generate_span_id(self) -> int:
            return int(ids.next.span_id)

        def generate_trace_id(self) -> int:
            return int(ids.next.trace_id)

        def is_trace_id_random(self) -> bool:
            return False  # derived from the turn id: samplers must not read randomness into it

    return PresetIdGenerator()


def _tracer_provider(names: list[str]) -> tuple[Any, _PresetIds]:
    from importlib.metadata import entry_points

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    ids = _PresetIds()
    own = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "stepq"}
    # the sampler comes from OTEL_TRACES_SAMPLER(_ARG); the resource from OTEL_SERVICE_NAME/OTEL_RESOURCE_ATTRIBUTES
    provider = TracerProvider(resource=Resource.create(own), id_generator=_id_generator(ids))
    available = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    for name in names:
        entry = available.get(_entry_point(name))
        if entry is None:
            raise ValueError(f"unknown OTEL_TRACES_EXPORTER {name!r} (installed: {', '.join(sorted(available))})")
        provider.add_span_processor(BatchSpanProcessor(entry.load()()))  # each reads its own OTEL_EXPORTER_*
    return provider, ids


def _entry_point(name: str) -> str:
    """`otlp` is OTLP over HTTP/protobuf (the extra's exporter) unless the protocol variables say gRPC."""
    if name != "otlp":
        return name
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return "otlp_proto_grpc" if (protocol or "").strip() == "grpc" else "otlp_proto_http"


def span_id(*parts: object) -> int:
    """A span id derived from what identifies the span: the same for every process that emits it."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def trace_ids(state: TurnState) -> tuple[int, int | None, int]:
    """(trace id, the submitter's span id or None, flags): from the stored traceparent, else from the turn id."""
    stored = trace_context.valid(state.traceparent)
    if stored is not None:
        trace_id, parent, flags = trace_context.parts(stored)
        return trace_id, parent, flags
    digest = hashlib.sha256(f"stepq-turn/{state.turn_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, None, 1


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class SpanExporter:
    """Emits each committed step's spans, and the turn's when it ends (see the module docstring)."""

    def __init__(self, provider: Any, ids: _PresetIds) -> None:
        from opentelemetry import trace

        self.provider = provider
        self.ids = ids
        self.tracer = provider.get_tracer("stepq")
        self._trace = trace
        self.capture = os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"

    # live points: nothing to emit (a span is emitted only once what it shows is committed)
    def step_started(self, ctx: StepContext) -> None:
        return None

    def model_requested(self, ctx: StepContext, request: StepRequest) -> None:
        return None

    def attempt_ended(self, d: Delivery, attempt: AttemptTrace) -> None:
        return None

    def step_finished(self, d: Delivery, trace: StepTrace, results: list[ToolResult]) -> None:
        try:
            self._emit_step(d, trace, results)
        except Exception as exc:  # tracing must never fail a committed step
            log.warning("spans of step %s of turn %s not emitted: %s", trace.step, d.state.turn_id, exc)

    def turn_finished(self, d: Delivery, result: TurnResult) -> str | None:
        try:
            self._emit_turn(d.state)
        except Exception as exc:
            log.warning("span of turn %s not emitted: %s", d.state.turn_id, exc)
        return None

    # ------------------------------------------------------------------ building the spans

    def _start(self, name: str, parent: tuple[int, int | None, int], own_id: int, start: float, **kw: Any) -> Any:
        """A span with a preset id under a parent given by ids alone (no span object of the parent is needed)."""
        trace = self._trace
        trace_id, parent_id, flags = parent
        context = None
        if parent_id is not None:
            parent_ctx = trace.SpanContext(trace_id, parent_id, is_remote=True, trace_flags=trace.TraceFlags(flags))
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent_ctx))
        ids = self.ids.next
        ids.trace_id, ids.span_id = trace_id, own_id
        return self.tracer.start_span(name, context=context, start_time=_ns(start), **kw)

    def _flags(self, state: TurnState) -> tuple[int, int | None, int]:
        """The trace id, the turn span's parent and the flags every span of the turn is sampled by."""
        trace_id, parent, flags = trace_ids(state)
        if parent is None:  # a root: the configured sampler decides once, from the trace id, for every span
            from opentelemetry.sdk.trace.sampling import Decision

            decision = self.provider.sampler.should_sample(None, trace_id, "invoke_agent").decision
            flags = 1 if decision == Decision.RECORD_AND_SAMPLE else 0
        return trace_id, parent, flags

    def _emit_step(self, d: Delivery, trace: StepTrace, results: list[ToolResult]) -> None:
        import time

        from opentelemetry.trace import SpanKind, Status, StatusCode

        state = d.state
        trace_id, _, flags = self._flags(state)
        turn_span = span_id(state.turn_id, "turn")
        step_span = span_id(state.turn_id, "step", trace.step)
        ended_turn = state.status.terminal and state.finished_at is not None and state.step == trace.step
        now = state.finished_at if ended_turn and state.finished_at is not None else time.time()
        started = trace.started_at or (trace.attempts[0].started_at if trace.attempts else now)
        step = self._start(
            f"step {trace.step}",
            (trace_id, turn_span, flags),
            step_span,
            started,
            attributes={
                "stepq.turn.id": state.turn_id,
                "stepq.step": trace.step,
                "stepq.step.rerun": trace.rerun,
                "stepq.step.retries": trace.retries,
                "gen_ai.agent.id": state.agent,
                "stepq.step.stop_reason": trace.stop_reason or "",
            },
        )
        under_step = (trace_id, step_span, flags)
        answer = _answer(state)
        for index, attempt in enumerate(trace.attempts):
            self._emit_attempt(state, trace, attempt, index, under_step, answer, SpanKind, Status, StatusCode)
        by_id = {r.tool_call_id: r for r in results}
        for call in trace.calls:
            self._emit_tool(state, trace, call, by_id.get(call.id), under_step, Status, StatusCode)
        if trace.parked_at is not None:
            waited = trace.parked_for or "approval"
            wait = self._start(
                f"wait {waited}", under_step, span_id(state.turn_id, "wait", trace.step), trace.parked_at
            )
            wait.set_attribute("stepq.wait.kind", waited)
            wait.end(end_time=_ns(trace.resumed_at or now))
        if state.status == TurnStatus.FAILED and state.step == trace.step:
            step.set_status(Status(StatusCode.ERROR, state.error or ""))
        step.end(end_time=_ns(now))

    def _emit_attempt(
        self,
        state: TurnState,
        trace: StepTrace,
        attempt: AttemptTrace,
        index: int,
        parent: tuple[int, int | None, int],
        answer: AssistantMessage | None,
        kind: Any,
        status: Any,
        code: Any,
    ) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAMES.get(attempt.provider, attempt.provider),
            "gen_ai.request.model": attempt.model,
            "gen_ai.conversation.id": state.thread_id or state.turn_id,
            "stepq.attempt": attempt.attempt,
            "stepq.attempt.outcome": attempt.outcome,
        }
        if attempt.replayed:
            attributes["stepq.attempt.replayed"] = True
        if attempt.usage is not None:
            attributes["gen_ai.usage.input_tokens"] = attempt.usage.input_tokens
            attributes["gen_ai.usage.output_tokens"] = attempt.usage.output_tokens
            attributes["gen_ai.usage.cache_read.input_tokens"] = attempt.usage.cache_read_tokens
            attributes["gen_ai.usage.cache_creation.input_tokens"] = attempt.usage.cache_write_tokens
        if attempt.outcome == "ok":
            attributes["gen_ai.response.model"] = attempt.model
            attributes["gen_ai.response.finish_reasons"] = [attempt.finish_reason or ""]
            if self.capture and answer is not None:
                attributes["gen_ai.output.messages"] = self._messages(answer)
        else:
            attributes["error.type"] = attempt.error or "_OTHER"
        span = self._start(
            f"chat {attempt.model}",
            parent,
            span_id(state.turn_id, "attempt", trace.step, index),
            attempt.started_at,
            kind=kind.CLIENT,
            attributes=attributes,
        )
        end = _ns(attempt.started_at + attempt.duration_s)
        if attempt.outcome in ("retry", "failover"):
            span.add_event(attempt.outcome, {"error.type": attempt.error or "_OTHER"}, timestamp=end)
        if attempt.outcome != "ok":
            span.set_status(status(code.ERROR, attempt.error or ""))
        span.end(end_time=end)

    def _emit_tool(
        self,
        state: TurnState,
        trace: StepTrace,
        call: ToolCallTrace,
        result: ToolResult | None,
        parent: tuple[int, int | None, int],
        status: Any,
        code: Any,
    ) -> None:
        started = call.started_at or trace.resumed_at or trace.started_at or 0.0
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "stepq.tool.status": call.status.value if call.status is not None else "not_run",
            "stepq.tool.ran": call.duration_s is not None,
        }
        if self.capture and result is not None:
            attributes["gen_ai.tool.call.result"] = self._redact(json.dumps(result.output, default=str))
        span = self._start(
            f"execute_tool {call.name}",
            parent,
            span_id(state.turn_id, "tool", trace.step, call.id),
            started,
            attributes=attributes,
        )
        if call.status is not None and call.status not in _OK:
            span.set_attribute("error.type", call.status.value)
            span.set_status(status(code.ERROR, call.status.value))
        span.end(end_time=_ns(started + (call.duration_s or 0.0)))

    def _emit_turn(self, state: TurnState) -> None:
        import time

        from opentelemetry.trace import SpanKind, Status, StatusCode

        trace_id, parent, flags = self._flags(state)
        usage = state.usage
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": state.agent,
            "gen_ai.agent.name": state.agent,
            "gen_ai.conversation.id": state.thread_id or state.turn_id,
            "gen_ai.provider.name": PROVIDER_NAMES.get(state.provider, state.provider),
            "gen_ai.request.model": state.model,
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
            "stepq.turn.id": state.turn_id,
            "stepq.turn.status": state.status.value,
            "stepq.turn.finish_reason": state.finish_reason.value if state.finish_reason else "",
            "stepq.turn.steps": len({s.step for s in state.trace.steps}),
        }
        if state.thread_id:
            attributes["stepq.thread.id"] = state.thread_id
        tenant = state.metadata.get("tenant")
        if isinstance(tenant, str) and tenant:
            attributes["stepq.tenant"] = tenant
        if state.cost is not None:
            attributes["stepq.turn.cost"] = state.cost
        if state.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = [state.finish_reason.value]
        span = self._start(
            f"invoke_agent {state.agent}",
            (trace_id, parent, flags),
            span_id(state.turn_id, "turn"),
            state.created_at,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        if state.status == TurnStatus.FAILED:
            span.set_attribute("error.type", "turn_failed")
            span.set_status(Status(StatusCode.ERROR, self._redact(state.error or "")))
        span.end(end_time=_ns(state.finished_at or time.time()))

    def _messages(self, message: AssistantMessage) -> str:
        parts: list[dict[str, Any]] = []
        if message.text:
            parts.append({"type": "text", "content": message.text})
        for call in message.tool_calls:
            parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.args})
        return self._redact(json.dumps([{"role": "assistant", "parts": parts}], default=str))

    def _redact(self, text: str) -> str:
        return Redactor(secret_values())(text)


def _answer(state: TurnState) -> AssistantMessage | None:
    for message in reversed(state.messages[-3:]):
        if isinstance(message, AssistantMessage):
            return message
    return None
