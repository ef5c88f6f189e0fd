"""Anthropic Messages SSE events -> canonical step output, and SDK failures -> ProviderError.

Blocks are keyed by their `index`: text and thinking deltas are emitted as they
arrive, thinking keeps its signature (and redacted thinking its data) so the next
step can send it back verbatim, and tool input JSON is assembled from its
`input_json_delta` pieces, each emitted as a `tool-input` delta (the output tool's as `object`). Usage comes from `message_start` and the cumulative
`message_delta` counts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2

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

PROVIDER = "anthropic"
CREDENTIAL_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
AUTH_HINT = "set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) to a valid key"

FINISH_REASONS: dict[str, FinishReason] = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "pause_turn": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "refusal": FinishReason.CONTENT_FILTER,
}

# error.type values the API may send inside a 200 stream (or as a JSON error body), and their HTTP status
ERROR_TYPE_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
CONTEXT_HINTS = ("prompt is too long", "context window", "context length", "too many tokens")


class RawEvent(dict[str, Any]):
    """A plain-JSON stream event (or batch result) with attribute access, read exactly like the SDK's
    typed event models by `StreamAccumulator`: the raw SSE path and the batch results share it."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return RawEvent(value) if type(value) is dict else value


def map_finish_reason(raw: str | None, had_tool_calls: bool) -> FinishReason:
    """max_tokens -> length, tool_use -> tool-calls, refusal -> content-filter, else stop."""
    if raw in FINISH_REASONS:
        return FINISH_REASONS[raw]
    return FinishReason.TOOL_CALLS if had_tool_calls else FinishReason.STOP


# --------------------------------------------------------------------------- stream accumulation


@dataclass
class _Block:
    kind: str  # text | thinking | redacted_thinking | tool_use | other
    text: list[str] = field(default_factory=list)
    signature: str | None = None
    data: str | None = None
    tool_id: str = ""
    name: str = ""
    json_parts: list[str] = field(default_factory=list)
    start_input: dict[str, Any] | None = None
    done: bool = False


def _parse_args(block: _Block) -> tuple[dict[str, Any], str | None]:
    """The tool input as a dict, plus the raw text when it was not a JSON object (a malformed call)."""
    raw = "".join(block.json_parts)
    if not raw.strip():
        return dict(block.start_input or {}), None
    try:
        value = json.loads(raw)
    except ValueError:
        return {}, raw
    return (value, None) if isinstance(value, dict) else ({}, raw)


class StreamAccumulator:
    """Feeds on the SDK's raw stream events; `output()` builds the step result from what arrived."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.blocks: dict[int, _Block] = {}
        self.stop_reason: str | None = None
        self.complete = False
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read = 0
        self.cache_write = 0
        self.thinking_tokens = 0

    def feed(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self._usage(event.message.usage)
        elif kind == "content_block_start":
            self._start(event.index, event.content_block)
        elif kind == "content_block_delta":
            self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            block = self.blocks.get(event.index)
            if block is not None:
                block.done = True
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            self._usage(event.usage)
        elif kind == "message_stop":
            self.complete = True

    def _usage(self, usage: Any) -> None:
        # message_delta counts are cumulative for the message: overwrite, never add
        if usage is None:
            return
        if getattr(usage, "input_tokens", None) is not None:
            self.input_tokens = usage.input_tokens
        if getattr(usage, "output_tokens", None) is not None:
            self.output_tokens = usage.output_tokens
        if getattr(usage, "cache_read_input_tokens", None) is not None:
            self.cache_read = usage.cache_read_input_tokens
        if getattr(usage, "cache_creation_input_tokens", None) is not None:
            self.cache_write = usage.cache_creation_input_tokens
        details = getattr(usage, "output_tokens_details", None)
        if details is not None and getattr(details, "thinking_tokens", None) is not None:
            self.thinking_tokens = details.thinking_tokens

    def _start(self, index: int, block: Any) -> None:
        kind = getattr(block, "type", "other")
        if kind == "text":
            self.blocks[index] = _Block("text")
            self._append(self.blocks[index], "text", block.text or "")
        elif kind == "thinking":
            self.blocks[index] = _Block("thinking", signature=block.signature or None)
            self._append(self.blocks[index], "reasoning", block.thinking or "")
        elif kind == "redacted_thinking":
            self.blocks[index] = _Block("redacted_thinking", data=block.data)
        elif kind == "tool_use":
            start_input = block.input if isinstance(block.input, dict) else None
            self.blocks[index] = _Block("tool_use", tool_id=block.id, name=block.name, start_input=start_input)
        else:
            self.blocks[index] = _Block("other")  # server tools etc.: not part of the canonical transcript

    def block_delta(self, index: int, delta: dict[str, Any]) -> None:
        """A `content_block_delta`'s delta as a plain dict (the raw stream's hot event): text without a wrapper."""
        if delta.get("type") != "text_delta":
            self._delta(index, RawEvent(delta))
            return
        block = self.blocks.get(index)
        if block is None:  # a text block may arrive without its content_block_start
            block = self.blocks[index] = _Block("text")
        self._append(block, "text", delta.get("text") or "")

    def _delta(self, index: int, delta: Any) -> None:
        kind = getattr(delta, "type", None)
        block = self.blocks.get(index)
        if block is None:  # a text block may arrive without its content_block_start
            block = self.blocks[index] = _Block("text" if kind == "text_delta" else "thinking")
        if kind == "text_delta":
            self._append(block, "text", delta.text)
        elif kind == "thinking_delta":
            self._append(block, "reasoning", delta.thinking)
        elif kind == "signature_delta":
            block.signature = (block.signature or "") + delta.signature
        elif kind == "input_json_delta":
            block.json_parts.append(delta.partial_json)
            if not delta.partial_json or block.kind != "tool_use":
                return
            if block.name == OUTPUT_TOOL:  # the structured answer, as it streams
                self.emit(Delta("object", delta.partial_json))
            else:
                self.emit(tool_input(block.tool_id, block.name, delta.partial_json))

    def _append(self, block: _Block, kind: str, text: str) -> None:
        if text:
            block.text.append(text)
            self.emit(Delta("text" if kind == "text" else "reasoning", text))

    def reported_usage(self) -> Usage | None:
        """What the provider reported so far (a failed call's `message_start`), or None if nothing."""
        if not (self.input_tokens or self.output_tokens or self.cache_read or self.cache_write):
            return None
        return self._usage_model()

    def _usage_model(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cache_read_tokens=self.cache_read or None,
            cache_write_tokens=self.cache_write or None,
            reasoning_tokens=self.thinking_tokens or None,
        )

    def output(self) -> StepOutput:
        parts: list[Any] = []
        for _, block in sorted(self.blocks.items()):
            if block.kind == "thinking":
                parts.append(ReasoningPart(text="".join(block.text), signature=block.signature, provider=PROVIDER))
            elif block.kind == "redacted_thinking" and block.data:
                parts.append(ReasoningPart(redacted_data=block.data, provider=PROVIDER))
            elif block.kind == "text" and block.text:
                parts.append(TextPart(text="".join(block.text)))
            elif block.kind == "tool_use" and (block.done or self.complete):
                args, invalid = _parse_args(block)
                parts.append(
                    ToolCall(
                        id=block.tool_id,
                        name=block.name,
                        args=args,
                        provider_data={"invalid_json": invalid[:2000]} if invalid is not None else None,
                    )
                )
        message = AssistantMessage(parts=parts)
        usage = self._usage_model()
        return StepOutput(
            message=message,
            usage=usage,
            raw_finish_reason=self.stop_reason,
            finish_reason=map_finish_reason(self.stop_reason, bool(message.tool_calls)),
        )


# --------------------------------------------------------------------------- failures


def scrub(text: str) -> str:
    """Remove credential values from text that may reach events or logs."""
    for name in CREDENTIAL_VARS:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _error_detail(body: object) -> tuple[str | None, str | None]:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return error.get("type"), error.get("message")
    return None, None


def classify_error(
    exc: BaseException, stall_timeout_s: float, label: str = "Anthropic", auth_hint: str = AUTH_HINT
) -> ProviderError:
    """Every SDK / transport failure as a ProviderError: retryable or fatal, with Retry-After when given."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        err_type, api_message = _error_detail(exc.body)
        err_type = err_type or exc.type
        detail = scrub(api_message or exc.api_message or str(exc))
        if exc.status_code == 200:  # the SDK raises an in-stream `event: error` with the 200's status
            return in_stream_error(err_type, detail, label, auth_hint)
        status = exc.status_code
        message = f"{label} returned {status} {err_type or 'error'}: {detail}"
        if status == 400 and any(h in detail.lower() for h in CONTEXT_HINTS):
            return ProviderError(
                f"{message} — the conversation exceeds the model's context window; shorten the prompt or tool "
                "results, or lower loop.max_steps",
                retryable=False,
                status=status,
                code="context_length",
            )
        if status == 402:
            return ProviderError(f"{message} — check the account's billing", retryable=False, status=402)
        return classify_status(
            status,
            message,
            retry_after_s=parse_retry_after(exc.response.headers),
            code=err_type,
            auth_hint=auth_hint,
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError(f"the request to {label} timed out", retryable=True, code="timeout")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__
        why = f": {type(cause).__name__}" if cause is not None else ""
        return ProviderError(f"could not reach {label}{why}", retryable=True, code="connection")
    if isinstance(exc, httpx2.TimeoutException):  # the SDK does not wrap a read timeout mid-stream
        return ProviderError(
            f"the {label} stream stalled: no data for {stall_timeout_s:g}s", retryable=True, code="stall"
        )
    if isinstance(exc, httpx2.TransportError):
        return ProviderError(
            f"the connection to {label} broke mid-stream: {type(exc).__name__}", retryable=True, code="connection"
        )
    if isinstance(exc, anthropic.CredentialsError):
        return ProviderError(f"{label} credentials could not be resolved — {auth_hint}", retryable=False, code="auth")
    return ProviderError(
        f"unexpected error from the Anthropic SDK: {type(exc).__name__}: {scrub(str(exc))}",
        retryable=False,
        code="sdk_error",
    )


def in_stream_error(err_type: str | None, detail: str, label: str, auth_hint: str) -> ProviderError:
    """An error event in a 200 stream (or an errored batch result): overload/rate/api errors retry;
    request/auth errors are fatal."""
    status = ERROR_TYPE_STATUS.get(err_type or "")
    message = f"{label} stream error {err_type or 'error'}: {detail}"
    if status is not None and status < 500 and status != 429:
        return classify_status(status, message, code=err_type, auth_hint=auth_hint)
    return ProviderError(message, retryable=True, code=err_type or "stream_error")
