"""Canonical step request -> Anthropic Messages request parameters.

Pure functions, no SDK calls: the transcript becomes alternating user/assistant
turns of content blocks, thinking blocks go back verbatim with their signatures,
tool results become one user turn of `tool_result` blocks, and at most four
`cache_control` breakpoints are placed (system, last tool, the two latest user turns).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from stepq.models import (
    AssistantMessage,
    FilePart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from stepq.providers.base import ProviderError, StepRequest, check_object_tools, object_schema

PROVIDER = "anthropic"
DEFAULT_MAX_TOKENS = 8192  # used when the agent sets no max_output_tokens (the API requires one)
THINKING_HEADROOM = 4096  # output room left for the answer when only a thinking budget is given
MAX_CACHE_BREAKPOINTS = 4  # the API rejects more than four cache_control markers

Block = dict[str, Any]
WireMessage = dict[str, Any]


# --------------------------------------------------------------------------- tools


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError for a tool Anthropic cannot be shown (bad name, non-object schema, duplicate)."""
    check_object_tools(specs, vendor="Anthropic", provider="anthropic", name_kind="tool", schema_kind="an input schema")


def tool_declarations(specs: list[ToolSpec]) -> list[Block]:
    tools: list[Block] = []
    for spec in specs:
        decl: Block = {"name": spec.name, "input_schema": object_schema(spec)}
        if spec.description:
            decl["description"] = spec.description
        if spec.strict:  # strict tool use: the model's input is constrained to the schema
            decl["strict"] = True
        tools.append(decl)
    return tools


def tool_choice(choice: str | None, names: list[str], disable_parallel: bool) -> Block | None:
    """auto/none/required map to auto/none/any; any other value forces the tool of that name."""
    if not names:
        return None
    if choice is None or choice == "auto":
        wire: Block = {"type": "auto"}
    elif choice == "none":
        return {"type": "none"}
    elif choice == "required":
        wire = {"type": "any"}
    elif choice in names:
        wire = {"type": "tool", "name": choice}
    else:
        raise ProviderError(
            f"tool_choice names {choice!r}, which is not among the tools shown to the model ({', '.join(names)})",
            retryable=False,
            code="invalid_tool_choice",
        )
    if disable_parallel:
        wire["disable_parallel_tool_use"] = True
    elif choice is None:
        return None  # the API default is auto; send nothing
    return wire


# --------------------------------------------------------------------------- transcript


def tool_result_content(result: ToolResult) -> str:
    """Errors read `Error executing tool <name>: <error>`; other outputs go as JSON text."""
    if result.is_error:
        output = result.output
        error = output.get("error", output) if isinstance(output, dict) else output
        text = error if isinstance(error, str) else json.dumps(error, ensure_ascii=False, default=str)
        return f"Error executing tool {result.name}: {text}"
    if isinstance(result.output, str):
        return result.output
    return json.dumps(result.output, ensure_ascii=False, default=str)


def file_block(part: FilePart) -> Block:
    """An image or document block with a base64 source; a text file goes as a document with a text source."""
    if part.data is None:
        raise ProviderError(f"file {part.name or part.url} cannot be sent to Anthropic (no data)", retryable=False)
    if part.media_type == "text/plain":
        text = base64.b64decode(part.data).decode("utf-8", errors="replace")
        block: Block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
    else:
        kind = "image" if part.media_type.startswith("image/") else "document"
        block = {"type": kind, "source": {"type": "base64", "media_type": part.media_type, "data": part.data}}
    if part.name and block["type"] == "document":
        block["title"] = part.name
    return block


def _assistant_blocks(message: AssistantMessage) -> list[Block]:
    blocks: list[Block] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.provider != PROVIDER:
                continue  # another provider's reasoning cannot be verified by Anthropic; leave it out
            if part.redacted_data:
                blocks.append({"type": "redacted_thinking", "data": part.redacted_data})
            elif part.signature:
                blocks.append({"type": "thinking", "thinking": part.text, "signature": part.signature})
        elif isinstance(part, TextPart):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, ToolCall):
            blocks.append({"type": "tool_use", "id": part.id, "name": part.name, "input": part.args})
    return blocks


def to_wire(request: StepRequest) -> tuple[list[str], list[WireMessage]]:
    """System texts and alternating user/assistant messages (consecutive same-role turns merged,
    tool_result blocks first in their user turn, as the API requires)."""
    system = [request.system] if request.system else []
    messages: list[WireMessage] = []

    def add(role: str, blocks: list[Block]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            merged = messages[-1]["content"] + blocks
            results = [b for b in merged if b["type"] == "tool_result"]
            others = [b for b in merged if b["type"] != "tool_result"]
            messages[-1]["content"] = results + others
        else:
            messages.append({"role": role, "content": blocks})

    for message in request.messages:
        if isinstance(message, SystemMessage):
            if message.content:
                system.append(message.content)
        elif isinstance(message, UserMessage):
            text = [{"type": "text", "text": message.content}] if message.content else []
            add("user", [*(file_block(f) for f in message.files), *text])
        elif isinstance(message, AssistantMessage):
            add("assistant", _assistant_blocks(message))
        elif isinstance(message, ToolResultMessage):
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": r.tool_call_id,
                        "content": tool_result_content(r),
                        "is_error": r.is_error,
                    }
                    for r in message.results
                ],
            )
    return system, messages


# --------------------------------------------------------------------------- cache breakpoints


def count_markers(system: list[Block], tools: list[Block], messages: list[WireMessage]) -> int:
    blocks = [*system, *tools, *(b for m in messages for b in m["content"])]
    return sum(1 for b in blocks if b.get("cache_control"))


def apply_cache_breakpoints(
    system: list[Block], tools: list[Block], messages: list[WireMessage], marker: Block
) -> None:
    """Mark the system prompt, the last tool and the latest user turns, never exceeding four markers.

    Marking the previous user turn too keeps the last step's cache entry reachable when a step
    added more than the API's 20-block lookback (many parallel tool calls)."""
    free = MAX_CACHE_BREAKPOINTS - count_markers(system, tools, messages)
    targets: list[Block] = []
    if system:
        targets.append(system[-1])
    if tools:
        targets.append(tools[-1])
    user_turns = [m for m in messages if m["role"] == "user" and m["content"]]
    targets.extend(m["content"][-1] for m in reversed(user_turns[-2:]))
    for block in targets:
        if free <= 0:
            break
        if not block.get("cache_control"):
            block["cache_control"] = dict(marker)
            free -= 1


# --------------------------------------------------------------------------- the request


EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}  # reasoning_effort -> effort


def thinking_config(request: StepRequest) -> Block | None:
    """Extended thinking: the step's `thinking_budget` (0: disabled), else the raw `thinking` option, else the
    `thinking_budget` option."""
    if request.thinking_budget is not None:
        if request.thinking_budget == 0:
            return {"type": "disabled"}
        return {"type": "enabled", "budget_tokens": int(request.thinking_budget)}
    raw = request.options.get("thinking")
    if isinstance(raw, dict):
        return dict(raw)
    budget = request.options.get("thinking_budget")
    if budget:
        return {"type": "enabled", "budget_tokens": int(budget)}
    return None


def build_params(request: StepRequest) -> dict[str, Any]:
    """Keyword arguments for `client.messages.create(stream=True, ...)`."""
    options = request.options
    system_texts, messages = to_wire(request)
    if not messages or messages[0]["role"] != "user":
        raise ProviderError(
            "the transcript has no user message before the first assistant turn; Anthropic needs one",
            retryable=False,
            code="invalid_transcript",
        )
    system: list[Block] = [{"type": "text", "text": text} for text in system_texts]
    tools = tool_declarations(request.tools)
    thinking = thinking_config(request)
    max_tokens = request.max_tokens
    budget = int(thinking.get("budget_tokens") or 0) if thinking else 0
    if max_tokens is None:
        max_tokens = max(DEFAULT_MAX_TOKENS, budget + THINKING_HEADROOM) if budget else DEFAULT_MAX_TOKENS
    elif budget and max_tokens <= budget:
        raise ProviderError(
            f"max_output_tokens ({max_tokens}) must be larger than provider_options thinking_budget ({budget})",
            retryable=False,
            code="invalid_thinking_budget",
        )
    if options.get("cache", True):
        marker: Block = {"type": "ephemeral"}
        if options.get("cache_ttl"):
            marker["ttl"] = str(options["cache_ttl"])
        apply_cache_breakpoints(system, tools, messages, marker)

    params: dict[str, Any] = {"model": request.model, "max_tokens": max_tokens, "messages": messages}
    if system:
        params["system"] = system
    if tools:
        params["tools"] = tools
        choice = tool_choice(
            request.tool_choice,
            [t["name"] for t in tools],
            bool(options.get("disable_parallel_tool_use")) or not request.parallel_tool_calls,
        )
        if choice is not None:
            params["tool_choice"] = choice
    if thinking is not None:
        params["thinking"] = thinking
    # no temperature / top_p: the Messages API of the SDK we build on takes no sampling parameters
    if request.reasoning_effort is not None:  # `output_config.effort` has no `minimal`: its lowest is `low`
        params["output_config"] = {"effort": EFFORTS[request.reasoning_effort]}
    if request.stop_sequences:
        params["stop_sequences"] = list(request.stop_sequences)
    betas = options.get("betas")
    if betas:
        params["extra_headers"] = {"anthropic-beta": ",".join(str(b) for b in betas)}
    return params
