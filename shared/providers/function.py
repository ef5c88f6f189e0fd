"""Offline models whose answers are a function of the request (the `function` and `test` providers).

The `scripted` provider replays fixed steps whatever it is asked. These answer what they are asked:

- `FunctionModel(fn)`: `fn(FunctionRequest) -> FunctionResponse | str` decides each step from the
  transcript, the tools it is shown and the output schema (the `function` provider; the agent carries
  it as `function_model=`).
- `TestModel()`: a ready-made function. It calls each of the tools it is shown once (none under
  `tool_choice="none"`, the named one under a forced tool choice), with arguments built
  from the tool's schema and the prompt, then answers: in object mode with an object built from the
  output schema and the prompt (a property named in the prompt as `name: value` takes that value;
  strings otherwise quote the prompt, numbers come from the prompt's numbers), so different inputs
  give different objects. Any agent runs on it with `provider="test"`.

Both honour a forced answer (object mode's reserved answer step) and stream like a real provider: text in
pieces, and each tool call's argument JSON as `tool-input` pieces before the call.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from stepq.models import (
    AssistantMessage,
    Delta,
    FinishReason,
    Message,
    StepOutput,
    TextPart,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
    tool_input,
)
from stepq.providers.base import OUTPUT_TOOL, Emit, ProviderAdapter, ShouldStop, StepRequest
from stepq.providers.scripted import ScriptToolCall

_DELTA_CHARS = 16
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


@dataclass(frozen=True)
class FunctionRequest:
    """What a `FunctionModel`'s function is asked: one step of a turn."""

    messages: list[Message]
    tools: list[ToolSpec]  # the agent's own tools (object mode's answer tool is not among them)
    output_schema: dict[str, Any] | None  # object mode: the answer's JSON schema
    answer_now: bool  # object mode: the answer is forced on this step (tools off, schema forced)
    system: str | None = None
    step: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # the agent's provider_options
    tool_choice: str | None = None  # the step's: auto, none, required or a tool name (None: unset)

    @property
    def prompt(self) -> str:
        """The text of the user messages, in order (what the answer is a function of)."""
        return "\n".join(m.content for m in self.messages if isinstance(m, UserMessage))

    @property
    def called(self) -> set[str]:
        """Names of the tools already called in this transcript."""
        return {c.name for m in self.messages if isinstance(m, AssistantMessage) for c in m.tool_calls}

    @property
    def tool_results(self) -> list[Any]:
        """Outputs of the tool results received so far, in order."""
        return [r.output for m in self.messages if isinstance(m, ToolResultMessage) for r in m.results]


class FunctionResponse(BaseModel):
    """One step's answer: text and/or tool calls, or (object mode) the object."""

    text: str = ""
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    object: Any = None
    input_tokens: int | None = None  # default: an estimate from the transcript's size
    output_tokens: int | None = None  # default: an estimate from the answer's size
    delta_delay_s: float = Field(default=0.0, ge=0)  # simulated latency before each streamed delta (demos)


ModelFunction = Callable[[FunctionRequest], "FunctionResponse | str"]


class FunctionModel(ProviderAdapter):
    """An offline model: each step is `function(FunctionRequest)`, streamed as a provider streams."""

    name = "function"
    tool_failure_breaker: int | None = None
    usage_is_measured = False  # its usage is a stand-in: compaction measures the request instead

    def __init__(self, function: ModelFunction) -> None:
        self.function = function

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        own = [t for t in request.tools if t.name != OUTPUT_TOOL]
        offers_output = len(own) != len(request.tools)
        asked = FunctionRequest(
            messages=list(request.messages),
            tools=own,
            output_schema=request.output_schema,
            answer_now=offers_output and request.tool_choice == OUTPUT_TOOL,
            system=request.system,
            step=request.step,
            options=dict(request.options),
            tool_choice=request.tool_choice,
        )
        answer = self.function(asked)
        if isinstance(answer, str):
            answer = FunctionResponse(text=answer)
        parts: list[Any] = []
        streamed = ""
        if answer.object is not None and offers_output:
            args = answer.object if isinstance(answer.object, dict) else {"value": answer.object}
            streamed = json.dumps(args, ensure_ascii=False)
            _stream(streamed, "object", emit, should_stop, answer.delta_delay_s)
            parts.append(ToolCall(id=f"call_{request.step}_out", name=OUTPUT_TOOL, args=args))
        else:
            text = answer.text if answer.object is None else json.dumps(answer.object, ensure_ascii=False)
            streamed = _stream(text, "text", emit, should_stop, answer.delta_delay_s)
            if streamed:
                parts.append(TextPart(text=streamed))
            for i, c in enumerate(answer.tool_calls):
                call = ToolCall(id=c.id or f"call_{request.step}_{i}", name=c.name, args=c.args)
                _stream_input(call, emit, should_stop, answer.delta_delay_s)
                parts.append(call)
        calls = [p for p in parts if isinstance(p, ToolCall)]
        transcript = sum(len(m.model_dump_json()) for m in request.messages) + len(request.system or "")
        usage = Usage(
            input_tokens=answer.input_tokens if answer.input_tokens is not None else max(1, transcript // 4),
            output_tokens=answer.output_tokens if answer.output_tokens is not None else max(1, len(streamed) // 4),
        )
        return StepOutput(
            message=AssistantMessage(parts=parts),
            usage=usage,
            raw_finish_reason="tool_use" if calls else "end_turn",
            finish_reason=FinishReason.TOOL_CALLS if calls else FinishReason.STOP,
        )


def _stream(text: str, kind: Any, emit: Emit, should_stop: ShouldStop, delay_s: float = 0.0) -> str:
    sent: list[str] = []
    for i in range(0, len(text), _DELTA_CHARS):
        if should_stop():
            break
        if delay_s:
            time.sleep(delay_s)  # simulated model latency, as the scripted provider's `delta_delay_s`
        chunk = text[i : i + _DELTA_CHARS]
        emit(Delta(kind, chunk))
        sent.append(chunk)
    return "".join(sent)


def _stream_input(call: ToolCall, emit: Emit, should_stop: ShouldStop, delay_s: float) -> None:
    """The call's arguments as a provider streams them: its JSON in pieces (the call itself is whole)."""
    text = json.dumps(call.args, ensure_ascii=False)
    for i in range(0, len(text), _DELTA_CHARS):
        if should_stop():
            return
        if delay_s:
            time.sleep(delay_s)  # simulated model latency, as for text
        emit(tool_input(call.id, call.name, text[i : i + _DELTA_CHARS]))


# --------------------------------------------------------------------------- TestModel


class TestModel(FunctionModel):
    """Calls every tool once (arguments from the tool schema and the prompt), then answers from the
    prompt and what the tools returned; objects are built from the output schema and the prompt."""

    __test__ = False  # not a pytest test class
    name = "test"

    def __init__(self) -> None:
        super().__init__(test_function)


def test_function(request: FunctionRequest) -> FunctionResponse:
    """TestModel's answer to one step (usable inside your own FunctionModel function too)."""
    prompt = request.prompt
    choice = request.tool_choice
    pending = [t for t in request.tools if t.name not in request.called and choice != "none"]
    if choice not in (None, "auto", "none", "required", OUTPUT_TOOL):  # a forced tool: that one, once more
        pending = [t for t in request.tools if t.name == choice]
    if pending and not request.answer_now:
        return FunctionResponse(
            tool_calls=[
                ScriptToolCall(name=t.name, args=_build(t.input_schema, t.input_schema, prompt, t.name))
                for t in pending
            ]
        )
    if request.output_schema is not None:
        return FunctionResponse(object=build_object(request.output_schema, prompt))
    results = request.tool_results
    seen = f" (tools said: {json.dumps(results, ensure_ascii=False, sort_keys=True)[:400]})" if results else ""
    return FunctionResponse(text=f"You said: {_excerpt(prompt, 400)}{seen}")


def build_object(schema: dict[str, Any], prompt: str) -> Any:
    """A value valid for `schema` (for the keywords it uses: types, properties, required, enum, const,
    min/max, lengths, items, $ref/$defs, anyOf/oneOf, email format), derived from `prompt`."""
    return _build(schema, schema, prompt, "")


def _seed(prompt: str, path: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{path}\x00{prompt}".encode()).digest()[:8], "big")


def _excerpt(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _named_value(prompt: str, name: str) -> str | None:
    """`name: value` or `name = value` in the prompt (the last path segment, any case, `_` or space)."""
    key = name.rsplit(".", 1)[-1].replace("_", "[ _]?")
    if not key:
        return None
    found = re.search(rf"(?i)\b{key}\s*[:=]\s*([^,;\n]+)", prompt)
    return found.group(1).strip() if found else None


def _resolve(root: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in schema and seen < 32:
        ref = str(schema["$ref"])
        node: Any = root
        for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else []:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        seen += 1
    return schema


def _build(root: dict[str, Any], schema: Any, prompt: str, path: str) -> Any:
    if not isinstance(schema, dict):
        return None
    schema = _resolve(root, schema)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        options = list(schema["enum"])
        named = _named_value(prompt, path)
        for option in options:
            if named is not None and str(option).lower() == named.lower():
                return option
        return options[_seed(prompt, path) % len(options)]
    for key in ("anyOf", "oneOf"):
        choices = [c for c in schema.get(key, []) if _resolve(root, c).get("type") != "null"]
        if choices:
            return _build(root, choices[0], prompt, path)
        if schema.get(key):
            return None
    if schema.get("allOf"):
        return _build(root, schema["allOf"][0], prompt, path)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        return {name: _build(root, sub, prompt, f"{path}.{name}" if path else name) for name, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        if "maxItems" in schema:
            count = min(count, int(schema["maxItems"]))
        return [_build(root, schema.get("items", {}), prompt, f"{path}[{i}]") for i in range(count)]
    if kind in ("integer", "number"):
        return _number(schema, prompt, path, integer=kind == "integer")
    if kind == "boolean":
        return _seed(prompt, path) % 2 == 1
    if kind == "null":
        return None
    return _string(schema, prompt, path)


def _string(schema: dict[str, Any], prompt: str, path: str) -> str:
    named = _named_value(prompt, path)
    if schema.get("format") == "email" or path.rsplit(".", 1)[-1].lower() == "email":
        found = _EMAIL.search(named or "") or _EMAIL.search(prompt)
        if found:
            return found.group(0)
        slug = re.sub(r"[^a-z0-9]+", ".", (named or prompt).lower()).strip(".")[:40] or "someone"
        return f"{slug}@example.com"
    value = named if named is not None else _excerpt(prompt, 200)
    low = int(schema.get("minLength", 0))
    high = schema.get("maxLength")
    if high is not None:
        value = value[: int(high)]
    if len(value) < low:
        value = value + "x" * (low - len(value))
    return value


def _number(schema: dict[str, Any], prompt: str, path: str, integer: bool) -> int | float:
    named = _named_value(prompt, path)
    numbers = [float(n) for n in _NUMBER.findall(named or "")] or [float(n) for n in _NUMBER.findall(prompt)]
    value = numbers[_seed(prompt, path) % len(numbers)] if numbers else float(_seed(prompt, path) % 1000)
    step = 1 if integer else 1e-6
    low: float | None = schema.get("minimum")
    high: float | None = schema.get("maximum")
    if low is None and schema.get("exclusiveMinimum") is not None:
        low = float(schema["exclusiveMinimum"]) + step
    if high is None and schema.get("exclusiveMaximum") is not None:
        high = float(schema["exclusiveMaximum"]) - step
    if low is not None and high is not None and high >= low:
        span = high - low
        if value < low or value > high:
            value = low + (value % (span + (1 if integer else 0))) if span else low
    elif low is not None and value < low:
        value = low + abs(value)
    elif high is not None and value > high:
        value = high - abs(value) % (abs(high) + 1)
    if integer:
        return int(value)
    return value
