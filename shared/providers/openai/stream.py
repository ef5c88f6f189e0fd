"""OpenAI stream events -> canonical step output, and SDK failures -> ProviderError.

`ResponsesAccumulator` reads the Responses API's typed events (`response.output_text.delta`,
`response.function_call_arguments.delta`, reasoning summaries, `response.completed` with usage, and the
`error` / `response.failed` events a 200 stream may carry). `ChatAccumulator` reads Chat Completions
chunks (content, tool-call pieces keyed by index, a compatible server's `reasoning_content`, and the
usage chunk). Both emit deltas as they arrive, a call's argument pieces as `tool-input` deltas; a forced
object-mode answer streams as `object` deltas and comes back as the `stepq_output` call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2
import openai

from stepq.models import (
    AssistantMessage,
    Delta,
    FinishReason,
    ReasoningPart,
    StepOutput,
    TextPart,
    ToolCall,
    Usage,
    tool_input,
)
from stepq.providers.base import OUTPUT_TOOL, Emit, ProviderError
from stepq.providers.errors import classify_status, parse_retry_after
from stepq.providers.openai.wire import PROVIDER

CREDENTIAL_VARS = (
    "OPENAI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "AZURE_OPENAI_AD_TOKEN",
    "STEPQ_OPENAI_COMPATIBLE_API_KEY",
)
CONTEXT_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
# error codes / types a stream (or a JSON error body) may carry that are worth another attempt
RETRYABLE_CODES = frozenset(
    {"rate_limit_exceeded", "server_error", "server_is_overloaded", "slow_down", "internal_error", "overloaded"}
)
CHAT_FINISH: dict[str, FinishReason] = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


@dataclass
class _Call:
    call_id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


@dataclass
class _Reasoning:
    item_id: str = ""
    text: list[str] = field(default_factory=list)
    encrypted: str | None = None


def _tool_call(call: _Call) -> ToolCall:
    raw = "".join(call.parts)
    args: Any = {}
    invalid: str | None = None
    if raw.strip():
        try:
            args = json.loads(raw)
        except ValueError:
            args, invalid = {}, raw
        if not isinstance(args, dict):
            args, invalid = {}, raw
    return ToolCall(
        id=call.call_id,
        name=call.name,
        args=args,
        provider_data={"invalid_json": invalid[:2000]} if invalid is not None else None,
    )


def _answer_call(text: str, step: int) -> ToolCall:
    """The JSON-schema answer as the `stepq_output` call the engine reads (invalid JSON is flagged)."""
    return _tool_call(_Call(call_id=f"call_{step}_out", name=OUTPUT_TOOL, parts=[text]))


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) else 0


class _Base:
    def __init__(self, emit: Emit, schema_answer: bool, step: int) -> None:
        self.emit = emit
        self.schema_answer = schema_answer  # the text is the JSON answer: emitted as object deltas
        self.step = step
        self.text: list[str] = []
        self.calls: dict[Any, _Call] = {}
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.reasoning_tokens = 0
        self.complete = False

    def _text(self, delta: str | None) -> None:
        if delta:
            self.text.append(delta)
            self.emit(Delta("object" if self.schema_answer else "text", delta))

    def _args(self, call: _Call, delta: str | None) -> None:
        if delta:
            call.parts.append(delta)
            if call.name == OUTPUT_TOOL:  # the structured answer, as it streams
                self.emit(Delta("object", delta))
            elif call.call_id and call.name and not self.schema_answer:  # a schema answer drops its calls
                self.emit(tool_input(call.call_id, call.name, delta))

    def reported_usage(self) -> Usage | None:
        if not (self.input_tokens or self.output_tokens):
            return None
        return self.usage()

    def usage(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,  # includes the cached tokens (see stepq.engine.pricing)
            output_tokens=self.output_tokens,
            cache_read_tokens=self.cached_tokens or None,
            reasoning_tokens=self.reasoning_tokens or None,
        )

    def _parts(self, reasoning: list[ReasoningPart]) -> list[Any]:
        parts: list[Any] = list(reasoning)
        text = "".join(self.text)
        if self.schema_answer:
            parts.append(_answer_call(text, self.step))
            return parts
        if text:
            parts.append(TextPart(text=text))
        parts.extend(_tool_call(c) for c in self.calls.values() if c.name)
        return parts


class ResponsesAccumulator(_Base):
    """Feeds on Responses API stream events."""

    def __init__(self, emit: Emit, schema_answer: bool, step: int) -> None:
        super().__init__(emit, schema_answer, step)
        self.reasoning: dict[str, _Reasoning] = {}
        self.status: str | None = None
        self.incomplete_reason: str | None = None

    def feed(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta":
            self._text(event.delta)
        elif kind == "response.output_item.added":
            self._item(event.item)
        elif kind == "response.function_call_arguments.delta":
            call = self.calls.setdefault(event.item_id, _Call())
            self._args(call, event.delta)
        elif kind == "response.output_item.done":
            self._item(event.item, done=True)
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            item = self.reasoning.setdefault(event.item_id, _Reasoning(item_id=event.item_id))
            if event.delta:
                item.text.append(event.delta)
                self.emit(Delta("reasoning", event.delta))
        elif kind in ("response.completed", "response.incomplete"):
            self._finish(event.response)
        elif kind == "response.failed":
            self._usage(getattr(event.response, "usage", None))
            error = getattr(event.response, "error", None)
            raise in_stream_error(getattr(error, "code", None), getattr(error, "message", None) or "response failed")
        elif kind == "error":
            raise in_stream_error(getattr(event, "code", None), getattr(event, "message", None) or "stream error")

    def _item(self, item: Any, done: bool = False) -> None:
        kind = getattr(item, "type", None)
        if kind == "function_call":
            call = self.calls.setdefault(item.id or item.call_id, _Call())
            call.call_id, call.name = item.call_id, item.name
            if done and not call.parts and item.arguments:
                call.parts.append(item.arguments)
        elif kind == "reasoning" and item.id:
            saved = self.reasoning.setdefault(item.id, _Reasoning(item_id=item.id))
            if done:
                saved.encrypted = getattr(item, "encrypted_content", None)
                if not saved.text:
                    saved.text = [s.text for s in (getattr(item, "summary", None) or []) if getattr(s, "text", "")]

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        self.input_tokens = _int(getattr(usage, "input_tokens", 0))
        self.output_tokens = _int(getattr(usage, "output_tokens", 0))
        self.cached_tokens = _int(getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", 0))
        self.reasoning_tokens = _int(getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", 0))

    def _finish(self, response: Any) -> None:
        self._usage(getattr(response, "usage", None))
        self.status = getattr(response, "status", None)
        details = getattr(response, "incomplete_details", None)
        self.incomplete_reason = getattr(details, "reason", None)
        self.complete = True

    def output(self) -> StepOutput:
        reasoning = [
            ReasoningPart(
                text="".join(r.text),
                signature=json.dumps({"id": r.item_id, "encrypted_content": r.encrypted}),
                provider=PROVIDER,
            )
            for r in self.reasoning.values()
        ]
        message = AssistantMessage(parts=self._parts(reasoning))
        raw = self.incomplete_reason or self.status
        if self.incomplete_reason == "max_output_tokens":
            finish = FinishReason.LENGTH
        elif self.incomplete_reason == "content_filter":
            finish = FinishReason.CONTENT_FILTER
        elif message.tool_calls and not self.schema_answer:
            finish = FinishReason.TOOL_CALLS
        else:
            finish = FinishReason.STOP
        return StepOutput(message=message, usage=self.usage(), raw_finish_reason=raw, finish_reason=finish)


class ChatAccumulator(_Base):
    """Feeds on Chat Completions chunks."""

    def __init__(self, emit: Emit, schema_answer: bool, step: int) -> None:
        super().__init__(emit, schema_answer, step)
        self.reasoning_text: list[str] = []
        self.finish: str | None = None

    def feed(self, chunk: Any) -> None:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.input_tokens = _int(getattr(usage, "prompt_tokens", 0))
            self.output_tokens = _int(getattr(usage, "completion_tokens", 0))
            self.cached_tokens = _int(getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0))
            details = getattr(usage, "completion_tokens_details", None)
            self.reasoning_tokens = _int(getattr(details, "reasoning_tokens", 0))
            if self.finish is not None:
                self.complete = True
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) != 0:
                continue
            delta = choice.delta
            reasoning = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
            if isinstance(reasoning, str) and reasoning:
                self.reasoning_text.append(reasoning)
                self.emit(Delta("reasoning", reasoning))
            self._text(delta.content)
            for piece in delta.tool_calls or []:
                call = self.calls.setdefault(piece.index, _Call())
                if piece.id:
                    call.call_id = piece.id
                function = piece.function
                if function is not None:
                    if function.name:
                        call.name = function.name
                    self._args(call, function.arguments)
            if choice.finish_reason:
                self.finish = choice.finish_reason
                self.complete = True  # servers without a usage chunk end here

    def output(self) -> StepOutput:
        reasoning = [ReasoningPart(text="".join(self.reasoning_text))] if self.reasoning_text else []
        message = AssistantMessage(parts=self._parts(reasoning))
        finish = CHAT_FINISH.get(self.finish or "", FinishReason.STOP)
        if self.schema_answer and finish == FinishReason.TOOL_CALLS:
            finish = FinishReason.STOP
        elif message.tool_calls and not self.schema_answer and finish == FinishReason.STOP:
            finish = FinishReason.TOOL_CALLS  # some compatible servers say `stop` next to tool calls
        return StepOutput(message=message, usage=self.usage(), raw_finish_reason=self.finish, finish_reason=finish)


# --------------------------------------------------------------------------- failures


def scrub(text: str, extra_vars: Sequence[str] = ()) -> str:
    """Remove credential values from text that may reach events or logs: the standard variables' and those
    of `extra_vars` (the variable an agent names in `provider_options["api_key_env"]`)."""
    for name in (*CREDENTIAL_VARS, *extra_vars):
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def without_secrets(error: ProviderError, extra_vars: Sequence[str]) -> ProviderError:
    """`error` with the values of `extra_vars` masked too. Applied once, where the adapter raises, so every
    path (HTTP errors, in-stream errors, transport failures) is covered."""
    message = scrub(error.message, extra_vars)
    if message == error.message:
        return error
    return ProviderError(
        message,
        retryable=error.retryable,
        status=error.status,
        retry_after_s=error.retry_after_s,
        code=error.code,
        usage=error.usage,
    )


def in_stream_error(code: str | None, message: str, label: str = "OpenAI") -> ProviderError:
    """An error inside a 200 stream: rate/server errors retry (before the first chunk); request errors are fatal."""
    text = f"{label} stream error {code or 'error'}: {scrub(message)}"
    if code in CONTEXT_CODES:
        return ProviderError(
            f"{text} — the conversation exceeds the model's context window; shorten the prompt or tool results",
            retryable=False,
            code="context_length",
        )
    if code is None or code in RETRYABLE_CODES:
        return ProviderError(text, retryable=True, code=code or "stream_error")
    return ProviderError(text, retryable=False, code=code)


def _detail(body: object) -> tuple[str | None, str | None]:
    """(code or type, message) of an error body: `{"error": {...}}` or the inner object itself."""
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        if isinstance(inner, dict):
            code = inner.get("code") or inner.get("type")
            return (str(code) if code is not None else None), inner.get("message")
    return None, None


def classify_error(exc: BaseException, stall_s: float, label: str, auth_hint: str) -> ProviderError:
    """Every SDK / transport failure as a ProviderError: retryable or fatal, with Retry-After when given."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        code, api_message = _detail(exc.body)
        detail = scrub(api_message or exc.message or str(exc))
        status = exc.status_code
        message = f"{label} returned {status} {code or 'error'}: {detail}"
        if status == 400 and code in CONTEXT_CODES:
            return ProviderError(
                f"{message} — the conversation exceeds the model's context window; shorten the prompt or tool "
                "results, or lower loop.max_steps",
                retryable=False,
                status=status,
                code="context_length",
            )
        return classify_status(
            status, message, retry_after_s=parse_retry_after(exc.response.headers), code=code, auth_hint=auth_hint
        )
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(
            f"the {label} stream stalled or timed out (no data for {stall_s:g}s)", retryable=True, code="stall"
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        why = f": {type(cause).__name__}" if cause is not None else ""
        return ProviderError(f"could not reach {label}{why}", retryable=True, code="connection")
    if isinstance(exc, openai.APIError):  # an error object inside a 200 stream (Chat Completions)
        code, api_message = _detail(exc.body)
        return in_stream_error(code, api_message or exc.message, label)
    if isinstance(exc, (httpx.TimeoutException, httpx2.TimeoutException)):  # the raw body's read (httpx2)
        return ProviderError(f"the {label} stream stalled: no data for {stall_s:g}s", retryable=True, code="stall")
    if isinstance(exc, (httpx.TransportError, httpx2.TransportError)):
        return ProviderError(
            f"the connection to {label} broke mid-stream: {type(exc).__name__}", retryable=True, code="connection"
        )
    if isinstance(exc, openai.OpenAIError):
        return ProviderError(
            f"{label} is not configured: {scrub(str(exc))} — {auth_hint}", retryable=False, code="auth"
        )
    return ProviderError(
        f"unexpected error from the OpenAI SDK: {type(exc).__name__}: {scrub(str(exc))}",
        retryable=False,
        code="sdk_error",
    )
