"""Bedrock Converse wire shapes: canonical transcript -> converse_stream request, stream events -> parts.

Kept apart from the adapter so the translation rules (messages, tools, finish reasons) are testable
without a client. Blocks of a streamed response are keyed by `contentBlockIndex`:
text blocks may arrive with no `contentBlockStart`, so any delta opens its block.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
import time
from dataclasses import dataclass, field
from typing import Any

from stepq.errors import DefinitionError
from stepq.models import (
    AssistantMessage,
    AssistantPart,
    Delta,
    FilePart,
    FinishReason,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
    tool_input,
)
from stepq.providers.base import OUTPUT_TOOL, ProviderError, StepRequest

PROVIDER = "bedrock"
# Bedrock's ToolSpecification.name (botocore service model: pattern [a-zA-Z0-9_-]+, length 1..64)
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

_FINISH = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "guardrail_intervened": FinishReason.CONTENT_FILTER,
    "content_filtered": FinishReason.CONTENT_FILTER,
    "malformed_model_output": FinishReason.ERROR,
    "malformed_tool_use": FinishReason.ERROR,
}
MALFORMED_STOPS = frozenset({"malformed_tool_use", "malformed_model_output"})


def map_finish_reason(raw: str | None, has_tool_calls: bool) -> FinishReason:
    """Bedrock's stop reasons, including filter/malformed/context ones; anything unknown follows the tool calls."""
    mapped = _FINISH.get(raw or "")
    if mapped is not None:
        return mapped
    return FinishReason.TOOL_CALLS if has_tool_calls else FinishReason.STOP


# --------------------------------------------------------------------------- tools


def check_tools(specs: list[ToolSpec]) -> None:
    """Refuse tools Bedrock cannot declare: names outside [a-zA-Z0-9_-]{1,64}, non-object schemas, duplicates."""
    seen: set[str] = set()
    for spec in specs:
        if not TOOL_NAME.match(spec.name):
            raise DefinitionError(
                f"tool {spec.name!r} cannot be declared to Bedrock: names must match [a-zA-Z0-9_-] "
                "and be 1-64 characters long; rename the tool"
            )
        if spec.name in seen:
            raise DefinitionError(f"tool {spec.name!r} is declared twice for Bedrock")
        seen.add(spec.name)
        schema_type = spec.input_schema.get("type", "object")
        if schema_type != "object":
            raise DefinitionError(
                f"tool {spec.name!r}: Bedrock needs an input schema whose top-level type is 'object', "
                f"got {schema_type!r}; wrap the arguments in an object"
            )


def _tool_config(request: StepRequest, history_has_tools: bool) -> dict[str, Any] | None:
    if not request.tools:
        return None
    if request.tool_choice == "none" and not history_has_tools:
        return None  # Bedrock has no "none" choice: hide the tools (kept only when the history needs them)
    tools: list[dict[str, Any]] = []
    for spec in request.tools:
        schema = spec.input_schema or {"type": "object", "properties": {}}
        tool_spec: dict[str, Any] = {"name": spec.name, "inputSchema": {"json": schema}}
        if spec.description:
            tool_spec["description"] = spec.description
        tools.append({"toolSpec": tool_spec})
    if request.options.get("cache_points"):
        tools.append({"cachePoint": {"type": "default"}})
    config: dict[str, Any] = {"tools": tools}
    choice = request.tool_choice
    if choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice and choice != "none":
        config["toolChoice"] = {"tool": {"name": choice}}
    return config


# --------------------------------------------------------------------------- transcript


def _error_text(result: ToolResult) -> str:
    output = result.output
    detail = output.get("error") if isinstance(output, dict) else None
    if not isinstance(detail, str):
        detail = output if isinstance(output, str) else json.dumps(output, default=str)
    return f"Error executing tool {result.name}: {detail}"


def tool_result_block(result: ToolResult) -> dict[str, Any]:
    """A toolResult block: objects as `json`, anything else as `text`; errors as text with status=error."""
    if result.is_error:
        content: list[dict[str, Any]] = [{"text": _error_text(result)}]
        return {"toolResult": {"toolUseId": result.tool_call_id, "content": content, "status": "error"}}
    output = result.output
    if isinstance(output, dict):
        content = [{"json": output}]
    elif isinstance(output, str):
        content = [{"text": output or "(empty)"}]
    else:
        content = [{"text": json.dumps(output, default=str)}]
    return {"toolResult": {"toolUseId": result.tool_call_id, "content": content, "status": "success"}}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.provider != PROVIDER:
                continue  # another provider's reasoning cannot be verified by Bedrock: drop it
            if part.redacted_data is not None:
                blocks.append({"reasoningContent": {"redactedContent": base64.b64decode(part.redacted_data)}})
            else:
                text_block: dict[str, Any] = {"text": part.text}
                if part.signature is not None:
                    text_block["signature"] = part.signature
                blocks.append({"reasoningContent": {"reasoningText": text_block}})
        elif isinstance(part, TextPart):
            if part.text:
                blocks.append({"text": part.text})
        else:
            blocks.append({"toolUse": {"toolUseId": part.id, "name": part.name, "input": part.args}})
    return blocks


_DOCUMENT_FORMATS = {"application/pdf": "pdf", "text/plain": "txt"}


def file_block(part: FilePart, index: int) -> dict[str, Any]:
    """An image or document block carrying the bytes (a document needs a plain name: letters, digits,
    single spaces, hyphens, parentheses, brackets)."""
    if part.data is None:
        raise ProviderError(f"file {part.name or part.url} cannot be sent to Bedrock (no data)", retryable=False)
    raw = base64.b64decode(part.data)
    if part.media_type.startswith("image/"):
        return {"image": {"format": part.media_type.split("/", 1)[1], "source": {"bytes": raw}}}
    stem = (part.name or "").rsplit(".", 1)[0]
    name = " ".join(re.sub(r"[^A-Za-z0-9\-()\[\] ]", " ", stem).split())[:100] or f"document {index}"
    return {"document": {"format": _DOCUMENT_FORMATS[part.media_type], "name": name, "source": {"bytes": raw}}}


def to_bedrock(request: StepRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """(system blocks, messages, history has tool blocks). Same-role neighbours are merged: Bedrock
    requires user/assistant alternation, and a note after tool results is a second user message."""
    system: list[dict[str, Any]] = []
    if request.system:
        system.append({"text": request.system})
    messages: list[dict[str, Any]] = []
    has_tools = False

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in request.messages:
        if isinstance(message, SystemMessage):
            if message.content:
                system.append({"text": message.content})
        elif isinstance(message, UserMessage):
            text = [{"text": message.content}] if message.content else []
            add("user", [*(file_block(f, i) for i, f in enumerate(message.files, 1)), *text])
        elif isinstance(message, AssistantMessage):
            has_tools = has_tools or bool(message.tool_calls)
            add("assistant", _assistant_blocks(message))
        elif isinstance(message, ToolResultMessage):
            has_tools = True
            add("user", [tool_result_block(r) for r in message.results])
    if system and request.options.get("cache_points"):
        system.append({"cachePoint": {"type": "default"}})
    return system, messages, has_tools


def build_request(request: StepRequest) -> dict[str, Any]:
    """The keyword arguments of `converse_stream` for one step."""
    system, messages, history_has_tools = to_bedrock(request)
    kwargs: dict[str, Any] = {"modelId": request.model, "messages": messages}
    if system:
        kwargs["system"] = system
    inference: dict[str, Any] = {}
    if request.max_tokens is not None:
        inference["maxTokens"] = request.max_tokens
    if request.temperature is not None:
        inference["temperature"] = request.temperature
    if request.sampling("top_p") is not None:
        inference["topP"] = request.sampling("top_p")
    if request.stop_sequences:
        inference["stopSequences"] = list(request.stop_sequences)
    if inference:
        kwargs["inferenceConfig"] = inference
    tool_config = _tool_config(request, history_has_tools)
    if tool_config is not None:
        kwargs["toolConfig"] = tool_config
    extra: dict[str, Any] = dict(request.options.get("additional_model_request_fields") or {})
    budget = request.sampling("thinking_budget")
    if budget:  # Claude on Bedrock: its own thinking field, passed through to the model
        extra.setdefault("thinking", {"type": "enabled", "budget_tokens": int(budget)})
    if extra:
        kwargs["additionalModelRequestFields"] = extra
    if request.options.get("guardrail_config"):
        kwargs["guardrailConfig"] = request.options["guardrail_config"]
    return kwargs


# --------------------------------------------------------------------------- the response stream


def fallback_tool_id() -> str:
    """`tool_<epoch-ms>_<up to 9 base36 chars>` when a toolUse arrives without an id (unique within a turn)."""
    alphabet = string.digits + string.ascii_lowercase
    return f"tool_{int(time.time() * 1000)}_{''.join(random.choices(alphabet, k=9))}"


@dataclass
class _Block:
    kind: str  # text | tool | reasoning
    text: list[str] = field(default_factory=list)
    tool_id: str = ""
    tool_name: str = ""
    input_buffer: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    redacted: bytes | None = None


@dataclass
class StreamAssembler:
    """Folds converse_stream events into assistant parts, usage and the raw stop reason."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    raw_stop: str | None = None
    usage: Usage = field(default_factory=Usage)
    malformed: bool = False

    def _block(self, index: int, kind: str) -> _Block:
        block = self.blocks.get(index)
        if block is None:
            block = _Block(kind=kind, tool_id=fallback_tool_id() if kind == "tool" else "")
            self.blocks[index] = block
        return block

    def on_event(self, event: dict[str, Any]) -> list[Delta]:
        """Apply one event; returns the content deltas it carried (a toolUse input piece as `tool-input`)."""
        if "contentBlockStart" in event:
            body = event["contentBlockStart"]
            tool = (body.get("start") or {}).get("toolUse")
            if tool is not None:
                block = self._block(int(body.get("contentBlockIndex", 0)), "tool")
                block.kind = "tool"
                block.tool_id = tool.get("toolUseId") or block.tool_id or fallback_tool_id()
                block.tool_name = tool.get("name") or ""
            return []
        if "contentBlockDelta" in event:
            return self._on_delta(event["contentBlockDelta"])
        if "contentBlockStop" in event:
            return []
        if "messageStop" in event:
            self.raw_stop = event["messageStop"].get("stopReason") or "end_turn"
            return []
        if "metadata" in event:
            usage = event["metadata"].get("usage") or {}
            self.usage = self.usage + Usage(
                input_tokens=int(usage.get("inputTokens") or 0),
                output_tokens=int(usage.get("outputTokens") or 0),
                cache_read_tokens=usage.get("cacheReadInputTokens") or None,
                cache_write_tokens=usage.get("cacheWriteInputTokens") or None,
            )
        return []

    def _on_delta(self, body: dict[str, Any]) -> list[Delta]:
        index = int(body.get("contentBlockIndex", 0))
        delta = body.get("delta") or {}
        out: list[Delta] = []
        if "text" in delta:
            text = delta["text"] or ""
            self._block(index, "text").text.append(text)
            if text:
                out.append(Delta("text", text))
        if "toolUse" in delta:
            fragment = (delta["toolUse"] or {}).get("input")
            if isinstance(fragment, str):
                tool = self._block(index, "tool")
                tool.input_buffer.append(fragment)
                if tool.tool_name == OUTPUT_TOOL and fragment:  # the structured answer, as it streams
                    out.append(Delta("object", fragment))
                elif fragment:
                    out.append(tool_input(tool.tool_id, tool.tool_name, fragment))
        if "reasoningContent" in delta:
            reasoning = delta["reasoningContent"] or {}
            block = self._block(index, "reasoning")
            if reasoning.get("text"):
                block.text.append(reasoning["text"])
                out.append(Delta("reasoning", reasoning["text"]))
            if reasoning.get("signature"):
                block.signature.append(reasoning["signature"])
            if reasoning.get("redactedContent") is not None:
                block.redacted = (block.redacted or b"") + bytes(reasoning["redactedContent"])
        return out

    def _tool_call(self, block: _Block) -> ToolCall:
        raw = "".join(block.input_buffer)
        args: Any = {}
        if raw.strip():
            try:
                args = json.loads(raw)
            except ValueError:
                args, self.malformed = {}, True
        if not isinstance(args, dict):
            args, self.malformed = {}, True
        return ToolCall(id=block.tool_id or fallback_tool_id(), name=block.tool_name, args=args)

    def message(self) -> AssistantMessage:
        parts: list[AssistantPart] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.kind == "text":
                text = "".join(block.text)
                if text:
                    parts.append(TextPart(text=text))
            elif block.kind == "reasoning":
                redacted = base64.b64encode(block.redacted).decode() if block.redacted is not None else None
                parts.append(
                    ReasoningPart(
                        text="".join(block.text),
                        signature="".join(block.signature) or None,
                        redacted_data=redacted,
                        provider=PROVIDER,
                    )
                )
            else:
                parts.append(self._tool_call(block))
        return AssistantMessage(parts=parts)
