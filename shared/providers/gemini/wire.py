"""Gemini wire translation: canonical transcript -> `contents`, streamed chunks -> canonical parts.

Thought signatures are opaque bytes that must go back exactly as they came. A signature on a
function call rides in `ToolCall.provider_data["thought_signature"]`; one on a thought part stays
on its `ReasoningPart`; one on a text part (or on the empty text part Gemini sometimes sends at
the end of a stream) becomes an empty-text `ReasoningPart` right after that text, and is put back
onto the text part before it when the transcript is sent again. All of them are stored as
standard base64 and decoded to the same bytes on the way out.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from google.genai import types

from stepq.models import (
    AssistantMessage,
    Delta,
    FilePart,
    FinishReason,
    Message,
    ReasoningPart,
    StepOutput,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from stepq.providers.gemini.schema import wire_name

PROVIDER = "gemini"

# --------------------------------------------------------------------------- finish reasons

FINISH_MAP: dict[str, FinishReason] = {
    "STOP": FinishReason.STOP,
    "FINISH_REASON_UNSPECIFIED": FinishReason.STOP,
    "MAX_TOKENS": FinishReason.LENGTH,
    "SAFETY": FinishReason.CONTENT_FILTER,
    "RECITATION": FinishReason.CONTENT_FILTER,
    "BLOCKLIST": FinishReason.CONTENT_FILTER,
    "PROHIBITED_CONTENT": FinishReason.CONTENT_FILTER,
    "SPII": FinishReason.CONTENT_FILTER,
    "IMAGE_SAFETY": FinishReason.CONTENT_FILTER,
    "IMAGE_PROHIBITED_CONTENT": FinishReason.CONTENT_FILTER,
    "IMAGE_RECITATION": FinishReason.CONTENT_FILTER,
    "MODEL_ARMOR": FinishReason.CONTENT_FILTER,
    "MALFORMED_FUNCTION_CALL": FinishReason.ERROR,
    "UNEXPECTED_TOOL_CALL": FinishReason.ERROR,
    "TOO_MANY_TOOL_CALLS": FinishReason.ERROR,
    "MISSING_THOUGHT_SIGNATURE": FinishReason.ERROR,
    "MALFORMED_RESPONSE": FinishReason.ERROR,
    "LANGUAGE": FinishReason.ERROR,
    "IMAGE_OTHER": FinishReason.ERROR,
    "NO_IMAGE": FinishReason.ERROR,
    "OTHER": FinishReason.ERROR,
}
PROMPT_BLOCKED = "PROMPT_BLOCKED:"  # raw reason prefix when the prompt itself was blocked (no candidates)


def map_finish_reason(raw: str | None, has_tool_calls: bool) -> FinishReason:
    """Gemini's finishReason -> ours. Gemini says STOP on function-call steps, so calls turn STOP into tool-calls."""
    if raw is not None and raw.startswith(PROMPT_BLOCKED):
        return FinishReason.CONTENT_FILTER
    mapped = FINISH_MAP.get(raw, FinishReason.ERROR) if raw is not None else FinishReason.STOP
    if has_tool_calls and mapped == FinishReason.STOP:
        return FinishReason.TOOL_CALLS
    return mapped


# --------------------------------------------------------------------------- signatures


def encode_signature(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def decode_signature(value: str | None) -> bytes | None:
    if not value:
        return None
    padded = value + "=" * (-len(value) % 4)
    return base64.b64decode(padded.replace("-", "+").replace("_", "/"))


# --------------------------------------------------------------------------- transcript -> contents


def to_contents(messages: list[Message]) -> tuple[list[types.Content], list[str]]:
    """Gemini `contents` for the transcript, plus any system texts found in it."""
    contents: list[types.Content] = []
    system: list[str] = []
    call_ids: dict[str, str] = {}  # our tool_call_id -> the API's functionCall.id, when it gave one
    for message in messages:
        if isinstance(message, SystemMessage):
            system.append(message.content)
        elif isinstance(message, UserMessage):
            text = [types.Part(text=message.content)] if message.content or not message.files else []
            contents.append(types.Content(role="user", parts=[*(file_part(f) for f in message.files), *text]))
        elif isinstance(message, AssistantMessage):
            parts = _model_parts(message, call_ids)
            if parts:
                contents.append(types.Content(role="model", parts=parts))
        elif isinstance(message, ToolResultMessage):
            contents.append(
                types.Content(role="user", parts=[_function_response(r, call_ids) for r in message.results])
            )
    return contents, system


def file_part(part: FilePart) -> types.Part:
    """Inline bytes (`inline_data`), or a `gs://` object by reference (`file_data`)."""
    if part.data is not None:
        return types.Part(inline_data=types.Blob(mime_type=part.media_type, data=base64.b64decode(part.data)))
    return types.Part(file_data=types.FileData(file_uri=part.url, mime_type=part.media_type))


def _model_parts(message: AssistantMessage, call_ids: dict[str, str]) -> list[types.Part]:
    parts: list[types.Part] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.provider != PROVIDER:
                continue  # another provider's reasoning means nothing to Gemini
            signature = decode_signature(part.signature)
            if part.text:
                parts.append(types.Part(text=part.text, thought=True, thought_signature=signature))
            elif signature is not None:
                prev = parts[-1] if parts else None
                if prev is not None and prev.text is not None and not prev.thought and prev.thought_signature is None:
                    prev.thought_signature = signature
                else:
                    parts.append(types.Part(text="", thought_signature=signature))
        elif isinstance(part, TextPart):
            if part.text:
                parts.append(types.Part(text=part.text))
        elif isinstance(part, ToolCall):
            data = part.provider_data or {}
            api_id = data.get("id") if isinstance(data.get("id"), str) else None
            if api_id:
                call_ids[part.id] = api_id
            parts.append(
                types.Part(
                    function_call=types.FunctionCall(name=wire_name(part.name), args=part.args, id=api_id),
                    thought_signature=decode_signature(data.get("thought_signature")),
                )
            )
    return parts


def tool_response(result: ToolResult) -> dict[str, Any]:
    """`functionResponse.response`: {"output": ...} for a result, {"error": "..."} for a failure."""
    if not result.is_error:
        return {"output": result.output}
    output = result.output
    if isinstance(output, dict) and isinstance(output.get("error"), str):
        return {"error": output["error"]}
    if isinstance(output, str):
        return {"error": output}
    return {"error": json.dumps(output, default=str)}


def _function_response(result: ToolResult, call_ids: dict[str, str]) -> types.Part:
    return types.Part(
        function_response=types.FunctionResponse(
            name=wire_name(result.name), response=tool_response(result), id=call_ids.get(result.tool_call_id)
        )
    )


# --------------------------------------------------------------------------- streamed chunks -> parts


class StreamParser:
    """Accumulates one streamed response: merges text/thought fragments, keeps signatures where they came."""

    def __init__(
        self, step: int, original_names: dict[str, str], emit: Callable[[Delta], None], text_kind: str = "text"
    ) -> None:
        self.step = step
        self.text_kind = text_kind  # "object" when the text is a structured answer's JSON
        self.original_names = original_names
        self.emit = emit
        self.parts: list[TextPart | ReasoningPart | ToolCall] = []
        self.raw_finish: str | None = None
        self.usage_meta: types.GenerateContentResponseUsageMetadata | None = None
        self._text: list[str] = []
        self._thought: list[str] = []
        self._calls = 0

    def feed(self, chunk: types.GenerateContentResponse) -> None:
        if chunk.usage_metadata is not None:
            self.usage_meta = chunk.usage_metadata
        feedback = chunk.prompt_feedback
        if feedback is not None and feedback.block_reason is not None and not chunk.candidates:
            self.raw_finish = PROMPT_BLOCKED + _enum_name(feedback.block_reason)
        if not chunk.candidates:
            return
        candidate = chunk.candidates[0]
        if candidate.content is not None and candidate.content.parts:
            for part in candidate.content.parts:
                self._part(part)
        if candidate.finish_reason is not None:
            self.raw_finish = _enum_name(candidate.finish_reason)

    def _part(self, part: types.Part) -> None:
        signature = encode_signature(part.thought_signature) if part.thought_signature else None
        if part.function_call is not None:
            self._flush()
            self._call(part.function_call, signature)
        elif part.thought:
            self._flush_text()
            if part.text:
                self._thought.append(part.text)
                self.emit(Delta("reasoning", part.text))
            if signature is not None:
                self.parts.append(ReasoningPart(text="".join(self._thought), signature=signature, provider=PROVIDER))
                self._thought.clear()
        elif part.text is not None:
            self._flush_thought()
            if part.text:
                self._text.append(part.text)
                self.emit(Delta(self.text_kind, part.text))  # type: ignore[arg-type]
            if signature is not None:
                self._flush_text()
                self.parts.append(ReasoningPart(text="", signature=signature, provider=PROVIDER))
        elif signature is not None:  # a signature on a part kind we do not model: keep it in order
            self._flush()
            self.parts.append(ReasoningPart(text="", signature=signature, provider=PROVIDER))

    def _call(self, call: types.FunctionCall, signature: str | None) -> None:
        name = call.name or ""
        data: dict[str, Any] = {}
        if signature is not None:
            data["thought_signature"] = signature
        if call.id:
            data["id"] = call.id
        self.parts.append(
            ToolCall(
                id=f"call_{self.step}_{self._calls}",
                name=self.original_names.get(name, name),
                args=dict(call.args or {}),
                provider_data=data or None,
            )
        )
        self._calls += 1

    def _flush_text(self) -> None:
        if self._text:
            self.parts.append(TextPart(text="".join(self._text)))
            self._text.clear()

    def _flush_thought(self) -> None:
        if self._thought:
            self.parts.append(ReasoningPart(text="".join(self._thought), provider=PROVIDER))
            self._thought.clear()

    def _flush(self) -> None:
        self._flush_thought()
        self._flush_text()

    def message(self) -> AssistantMessage:
        self._flush()
        return AssistantMessage(parts=list(self.parts))

    def usage(self) -> Usage:
        return usage_from(self.usage_meta)

    def output(self) -> StepOutput:
        """What the stream (or a batch's whole response) amounted to: the step's output."""
        message = self.message()
        return StepOutput(
            message=message,
            usage=self.usage(),
            raw_finish_reason=self.raw_finish,
            finish_reason=map_finish_reason(self.raw_finish, bool(message.tool_calls)),
        )


def usage_from(meta: types.GenerateContentResponseUsageMetadata | None) -> Usage:
    """Input = prompt (+ tool-use prompt) tokens, cached included; output = candidates + thoughts (both billed)."""
    if meta is None:
        return Usage()
    thoughts = meta.thoughts_token_count or 0
    return Usage(
        input_tokens=(meta.prompt_token_count or 0) + (meta.tool_use_prompt_token_count or 0),
        output_tokens=(meta.candidates_token_count or 0) + thoughts,
        cache_read_tokens=meta.cached_content_token_count or None,
        reasoning_tokens=thoughts or None,
    )


def _enum_name(value: Any) -> str:
    return str(getattr(value, "value", value))
