"""Canonical step request -> OpenAI request parameters, for the Responses API and for Chat Completions.

Pure functions, no SDK calls. Both shapes carry the same transcript: the system prompt, user text,
assistant text and function calls, and tool results keyed by call id. Reasoning goes back only to the
Responses API and only when OpenAI produced it (its encrypted content); other providers' reasoning is left
out. A forced object-mode answer (`tool_choice == stepq_output`) goes out as the API's native JSON-schema
output instead of a function call, and its JSON text comes back as the `stepq_output` call.

Files in user messages go before the text, as base64 data URLs: the Responses API takes images as
`input_image` and PDFs and text files as `input_file`; Chat Completions takes images as `image_url`, PDFs as
`file` parts (OpenAI and Azure; an OpenAI-compatible server only with `provider_options["file_parts"]`,
since most of them refuse the part) and a text file as a text part with its contents.
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
from stepq.providers.base import OUTPUT_TOOL, ProviderError, StepRequest, check_object_tools, object_schema

PROVIDER = "openai"  # the reasoning parts this module sends back (Responses API only)
SCHEMA_NAME = "stepq_output"

Item = dict[str, Any]


# --------------------------------------------------------------------------- tools


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError for a tool OpenAI cannot be shown (bad name, non-object schema, duplicate)."""
    check_object_tools(specs, vendor="OpenAI", provider="openai", name_kind="function", schema_kind="parameters")


def answers_with_schema(request: StepRequest) -> bool:
    """A forced structured answer goes out as the API's JSON-schema output, not as a function call."""
    return request.output_schema is not None and request.tool_choice == OUTPUT_TOOL


def answer_schema(request: StepRequest) -> dict[str, Any]:
    """The answer's schema as the output tool declares it (a non-object answer is wrapped in an object)."""
    spec = next((t for t in request.tools if t.name == OUTPUT_TOOL), None)
    return object_schema(spec) if spec is not None else dict(request.output_schema or {})


def _check_choice(choice: str, names: list[str]) -> None:
    if choice not in ("auto", "none", "required") and choice not in names:
        raise ProviderError(
            f"tool_choice names {choice!r}, which is not among the tools shown to the model ({', '.join(names)})",
            retryable=False,
            code="invalid_tool_choice",
        )


# --------------------------------------------------------------------------- transcript pieces


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


def _arguments(call: ToolCall) -> str:
    return json.dumps(call.args, ensure_ascii=False)


def reasoning_item(part: ReasoningPart) -> Item | None:
    """An OpenAI reasoning item to send back (its id, summary and encrypted content), else None."""
    if part.provider != PROVIDER or not part.signature:
        return None
    try:
        saved = json.loads(part.signature)
    except ValueError:
        return None
    if not isinstance(saved, dict) or not saved.get("id"):
        return None
    item: Item = {"type": "reasoning", "id": saved["id"], "summary": []}
    if part.text:
        item["summary"] = [{"type": "summary_text", "text": part.text}]
    if saved.get("encrypted_content"):
        item["encrypted_content"] = saved["encrypted_content"]
    return item


# --------------------------------------------------------------------------- files


def _data(part: FilePart, provider: str) -> str:
    """The file's base64 bytes (the worker filled them in for this call)."""
    if part.data is None:
        raise ProviderError(f"file {part.name or part.url} cannot be sent to {provider} (no data)", retryable=False)
    return part.data


def _data_url(part: FilePart, provider: str) -> str:
    return f"data:{part.media_type};base64,{_data(part, provider)}"


def _filename(part: FilePart) -> str:
    return part.name or ("document.pdf" if part.media_type == "application/pdf" else "document.txt")


def chat_takes_pdf(provider: str, options: dict[str, Any]) -> bool:
    """OpenAI and Azure take PDFs as Chat Completions `file` parts; a compatible server only when the agent says so."""
    return provider != "openai-compatible" or bool(options.get("file_parts"))


def responses_file(part: FilePart, provider: str) -> Item:
    """An `input_image` (images) or `input_file` (PDFs, text files), with the bytes as a data URL."""
    if part.media_type.startswith("image/"):
        return {"type": "input_image", "image_url": _data_url(part, provider), "detail": "auto"}
    return {"type": "input_file", "filename": _filename(part), "file_data": _data_url(part, provider)}


def chat_file(part: FilePart, provider: str, options: dict[str, Any]) -> Item:
    """An `image_url` part, a PDF `file` part, or a text file's contents as a text part."""
    if part.media_type.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": _data_url(part, provider)}}
    if part.media_type == "text/plain":
        text = base64.b64decode(_data(part, provider)).decode("utf-8", errors="replace")
        return {"type": "text", "text": f"{part.name}:\n{text}" if part.name else text}
    if part.media_type == "application/pdf" and chat_takes_pdf(provider, options):
        return {"type": "file", "file": {"filename": _filename(part), "file_data": _data_url(part, provider)}}
    raise ProviderError(
        f"{provider} cannot take {part.media_type} files over Chat Completions (file {part.name or part.media_type!r}); "
        "set provider_options file_parts=true if the server accepts OpenAI file parts, or send images or text",
        retryable=False,
        code="unsupported_media_type",
    )


# --------------------------------------------------------------------------- Responses API


def responses_input(request: StepRequest) -> list[Item]:
    items: list[Item] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            if message.content:
                items.append({"role": "developer", "content": message.content})
        elif isinstance(message, UserMessage):
            if message.files:
                content = [responses_file(f, request.provider) for f in message.files]
                if message.content:
                    content.append({"type": "input_text", "text": message.content})
                items.append({"role": "user", "content": content})
            elif message.content:
                items.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            for part in message.parts:
                if isinstance(part, ReasoningPart):
                    reasoning = reasoning_item(part)
                    if reasoning is not None:
                        items.append(reasoning)
                elif isinstance(part, TextPart) and part.text:
                    items.append({"role": "assistant", "content": part.text})
                elif isinstance(part, ToolCall):
                    items.append(
                        {"type": "function_call", "call_id": part.id, "name": part.name, "arguments": _arguments(part)}
                    )
        elif isinstance(message, ToolResultMessage):
            items.extend(
                {"type": "function_call_output", "call_id": r.tool_call_id, "output": tool_result_content(r)}
                for r in message.results
            )
    return items


def responses_params(request: StepRequest) -> dict[str, Any]:
    """Keyword arguments for `client.responses.create(stream=True, ...)`."""
    options = request.options
    params: dict[str, Any] = {"model": request.model, "input": responses_input(request)}
    params["store"] = bool(options.get("store", False))  # stateless: every step sends the whole transcript
    if request.system:
        params["instructions"] = request.system
    if answers_with_schema(request):
        params["text"] = {"format": _json_schema_format(request, nested=False)}
    else:
        tools = list(request.tools)
        if tools:
            params["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": object_schema(t),
                    "strict": t.strict,
                }
                for t in tools
            ]
            choice = request.tool_choice
            if choice is not None:  # unset: the API's default (auto)
                _check_choice(choice, [t.name for t in tools])
                params["tool_choice"] = (
                    choice if choice in ("auto", "none", "required") else {"type": "function", "name": choice}
                )
            if options.get("disable_parallel_tool_use") or not request.parallel_tool_calls:
                params["parallel_tool_calls"] = False
    if request.max_tokens is not None:
        params["max_output_tokens"] = request.max_tokens
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.sampling("top_p") is not None:
        params["top_p"] = request.sampling("top_p")
    effort, summary = request.sampling("reasoning_effort"), options.get("reasoning_summary")
    if effort or summary:
        reasoning: dict[str, Any] = {}
        if effort:
            reasoning["effort"] = str(effort)
        reasoning["summary"] = str(summary or "auto")
        params["reasoning"] = reasoning
        if not params["store"]:
            params["include"] = ["reasoning.encrypted_content"]  # sent back on the next step
    return params


def _json_schema_format(request: StepRequest, nested: bool) -> dict[str, Any]:
    body = {"name": SCHEMA_NAME, "schema": answer_schema(request), "strict": bool(request.options.get("strict"))}
    return {"type": "json_schema", "json_schema": body} if nested else {"type": "json_schema", **body}


# --------------------------------------------------------------------------- Chat Completions


def chat_messages(request: StepRequest) -> list[Item]:
    messages: list[Item] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        if isinstance(message, SystemMessage):
            if message.content:
                messages.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            if message.files:
                parts = [chat_file(f, request.provider, request.options) for f in message.files]
                if message.content:
                    parts.append({"type": "text", "text": message.content})
                messages.append({"role": "user", "content": parts})
            else:
                messages.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            text = "".join(p.text for p in message.parts if isinstance(p, TextPart))
            calls = message.tool_calls
            wire: Item = {"role": "assistant", "content": text or None}
            if calls:
                wire["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c)}}
                    for c in calls
                ]
            if text or calls:
                messages.append(wire)
        elif isinstance(message, ToolResultMessage):
            messages.extend(
                {"role": "tool", "tool_call_id": r.tool_call_id, "content": tool_result_content(r)}
                for r in message.results
            )
    return messages


def _chat_function(spec: ToolSpec) -> dict[str, Any]:
    """A Chat Completions function; `strict` only when asked (servers speaking the API may not know the key)."""
    function: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description or "",
        "parameters": object_schema(spec),
    }
    if spec.strict:
        function["strict"] = True
    return function


def chat_params(request: StepRequest) -> dict[str, Any]:
    """Keyword arguments for `client.chat.completions.create(stream=True, ...)`."""
    options = request.options
    params: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request),
        "stream_options": {"include_usage": True},  # the usage arrives in a last chunk
    }
    if answers_with_schema(request):
        params["response_format"] = _json_schema_format(request, nested=True)
    elif request.tools:
        params["tools"] = [{"type": "function", "function": _chat_function(t)} for t in request.tools]
        choice = request.tool_choice
        if choice is not None:  # unset: the API's default (auto)
            _check_choice(choice, [t.name for t in request.tools])
            params["tool_choice"] = (
                choice if choice in ("auto", "none", "required") else {"type": "function", "function": {"name": choice}}
            )
        if options.get("disable_parallel_tool_use") or not request.parallel_tool_calls:
            params["parallel_tool_calls"] = False
    if request.max_tokens is not None:
        params[str(options.get("max_tokens_param", "max_tokens"))] = request.max_tokens
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.stop_sequences:
        params["stop"] = list(request.stop_sequences)
    if request.sampling("top_p") is not None:
        params["top_p"] = request.sampling("top_p")
    if request.sampling("reasoning_effort"):
        params["reasoning_effort"] = str(request.sampling("reasoning_effort"))
    return params
