"""The offline `scripted` provider: deterministic steps carried by the agent definition.

It is the demo's model and the tests' model. Step N of a turn plays `script[N]`
(the last entry repeats once the script runs out); with the agent's
`provider_options={"script_by": "conversation"}` it plays `script[N]` where N counts the
assistant messages it was sent, so a conversation continued over several turns moves
through the script. A step streams its text in
several deltas and can inject the failures the retry rule cares about:
`before` (an HTTP error before the stream), `in-stream` (an error event inside a
200 stream, before content) and `after-content` (an error after partial text). It honours the step's
tool choice as a provider does: under `none` the step's scripted tool calls are dropped, and under a forced
tool only calls to that tool are kept.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
import zlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stepq.models import (
    AssistantMessage,
    Delta,
    FinishReason,
    Message,
    ReasoningPart,
    StepOutput,
    TextPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from stepq.providers.base import (
    OUTPUT_TOOL,
    BatchAPI,
    BatchState,
    Emit,
    ProviderAdapter,
    ProviderError,
    ShouldStop,
    StepRequest,
)

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})


class ScriptFailure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    when: Literal["before", "in-stream", "after-content"] = "before"
    status: int | None = 429
    retry_after_s: float | None = None
    message: str = "rate limited"
    code: str | None = None
    times: int = Field(default=1, ge=1)  # fail on attempts 0..times-1, then succeed
    retryable: bool | None = None  # default: decided by status (in-stream errors are retryable)


class ScriptToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    args: Any = Field(default_factory=dict)
    id: str | None = None


class ScriptStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    object: Any = None  # object mode: the final JSON answer (serialized as the step's text)
    fail: ScriptFailure | None = None
    echo_tools: bool = False  # prepend "tools: a,b" to the text: shows what the model was shown
    echo_messages: bool = False  # prepend "saw: ..." (the transcript it was sent): shows what the model received
    echo_tool_choice: bool = False  # prepend "tool_choice: ..." (what the step asked for)
    fresh_call_ids: bool = False  # new tool-call ids on every call, as real providers give
    delta_chars: int = Field(default=6, ge=1)
    delta_delay_s: float = Field(default=0.0, ge=0)
    raw_finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def full_text(self, tool_names: list[str], messages: list[Message] | None = None) -> str:
        text = self.text
        if self.object is not None:
            text = json.dumps(self.object)
        if self.echo_messages:
            text = f"saw: {' | '.join(_summary(m) for m in messages or [])}" + (f"\n{text}" if text else "")
        if self.echo_tools:
            text = f"tools: {','.join(tool_names)}" + (f"\n{text}" if text else "")
        return text


def _summary(message: Message) -> str:
    """One message of the transcript in a line, for `echo_messages`."""
    if isinstance(message, AssistantMessage):
        calls = "".join(f" call:{c.name}" for c in message.tool_calls)
        return f"assistant:{message.text.splitlines()[-1] if message.text else ''}{calls}"
    if isinstance(message, ToolResultMessage):
        return "tool:" + ",".join(f"{r.name}={json.dumps(r.output, sort_keys=True)}" for r in message.results)
    files = message.files if isinstance(message, UserMessage) else []
    shown = "".join(f" [{f.media_type}, {len(base64.b64decode(f.data)) if f.data else 0} bytes]" for f in files)
    return f"{message.role}:{message.content}{shown}"


_FINISH_MAP = {
    "stop": FinishReason.STOP,
    "end_turn": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


def _transcript_chars(messages: list[Message]) -> int:
    """A stand-in transcript size for the usage estimate: deterministic, and O(1) so that the free
    offline model costs nothing per step (benchmarks measure stepq, not this estimate)."""
    return 100 * len(messages)


def _summary_answer(request: StepRequest) -> StepOutput:
    """A deterministic summary: how much it summarised and the first line of what it was given."""
    given = "".join(m.content for m in request.messages if isinstance(m, UserMessage))
    text = f"summary of {len(given)} chars: {given.splitlines()[0][:120] if given else ''}"
    usage = Usage(input_tokens=len(given) // 4, output_tokens=len(text) // 4)
    return StepOutput(
        message=AssistantMessage(parts=[TextPart(text=text)]), usage=usage, finish_reason=FinishReason.STOP
    )


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _raise(failure: ScriptFailure) -> None:
    retryable = failure.retryable
    if retryable is None:
        retryable = failure.when == "in-stream" or (failure.status in RETRYABLE_STATUSES)
    raise ProviderError(
        failure.message,
        retryable=retryable,
        status=failure.status,
        retry_after_s=failure.retry_after_s,
        code=failure.code,
    )


def _may_call(request: StepRequest, name: str) -> bool:
    """The tool choice, as a provider enforces it: no calls under `none`, only the named tool when one is forced.
    (A call to a tool the step does not show is kept: tests use it to see the engine refuse it.)"""
    choice = request.tool_choice
    if choice == "none":
        return False  # (object mode's forced answer is its own path: `object` steps answer through it)
    return choice in (None, "auto", "required", OUTPUT_TOOL) or choice == name


class ScriptedAdapter(ProviderAdapter):
    """Plays an agent's script. Stateless: which step to play comes from the request."""

    name = "scripted"
    tool_failure_breaker: int | None = None
    usage_is_measured = False  # its usage is a stand-in: compaction measures the request instead

    def __init__(self, script: list[ScriptStep]) -> None:
        if not script:
            raise ValueError("the scripted provider needs an agent with a non-empty `script`")
        self.script = script

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        if request.purpose == "summary":  # compaction's summary call: not a step of the script
            return _summary_answer(request)
        position = request.step
        if request.options.get("script_by") == "conversation":
            position = sum(isinstance(m, AssistantMessage) for m in request.messages)
        step = self.script[min(position, len(self.script) - 1)]
        failing = step.fail is not None and request.attempt < step.fail.times
        if failing and step.fail is not None and step.fail.when in ("before", "in-stream"):
            _raise(step.fail)

        parts: list[Any] = []
        if step.reasoning:
            for chunk in _chunks(step.reasoning, step.delta_chars):
                emit(Delta("reasoning", chunk))
            parts.append(ReasoningPart(text=step.reasoning, signature="scripted-sig", provider="scripted"))

        native = step.object is not None and any(t.name == OUTPUT_TOOL for t in request.tools)
        if native:  # answer through the output tool, streaming the object's JSON as object deltas
            return self._native_object(request, step, emit, should_stop, parts)
        text = step.full_text([t.name for t in request.tools], request.messages)
        if step.echo_tool_choice:
            text = f"tool_choice: {request.tool_choice or 'unset'}" + (f"\n{text}" if text else "")
        chunks = _chunks(text, step.delta_chars)
        emitted: list[str] = []
        for index, chunk in enumerate(chunks):
            if should_stop():
                break
            if step.delta_delay_s:
                time.sleep(step.delta_delay_s)  # simulated model latency
            emit(Delta("text", chunk))
            emitted.append(chunk)
            if failing and step.fail is not None and index == (len(chunks) - 1) // 2:
                _raise(step.fail)
        if failing and step.fail is not None and not chunks:
            _raise(step.fail)
        if emitted:
            parts.append(TextPart(text="".join(emitted)))

        suffix = f"_{uuid.uuid4().hex[:8]}" if step.fresh_call_ids else ""
        calls = [
            ToolCall(id=c.id or f"call_{request.step}_{i}{suffix}", name=c.name, args=c.args)
            for i, c in enumerate(step.tool_calls)
            if _may_call(request, c.name)
        ]
        parts.extend(calls)
        raw = step.raw_finish_reason or ("tool_use" if calls else "end_turn")
        transcript_chars = _transcript_chars(request.messages)
        usage = Usage(
            input_tokens=step.input_tokens if step.input_tokens is not None else max(1, transcript_chars // 4),
            output_tokens=step.output_tokens if step.output_tokens is not None else max(1, len(text) // 4),
        )
        return StepOutput(
            message=AssistantMessage(parts=parts),
            usage=usage,
            raw_finish_reason=raw,
            finish_reason=_FINISH_MAP.get(raw, FinishReason.STOP),
        )

    def batch_api(self) -> BatchAPI | None:
        return ScriptedBatchAPI(self.script)

    def _native_object(
        self, request: StepRequest, step: ScriptStep, emit: Emit, should_stop: ShouldStop, parts: list[Any]
    ) -> StepOutput:
        args = step.object if isinstance(step.object, dict) else {"value": step.object}
        encoded = json.dumps(args)
        for chunk in _chunks(encoded, step.delta_chars):
            if should_stop():
                break
            if step.delta_delay_s:
                time.sleep(step.delta_delay_s)  # simulated model latency
            emit(Delta("object", chunk))
        parts.append(ToolCall(id=f"call_{request.step}_out", name=OUTPUT_TOOL, args=args))
        transcript_chars = _transcript_chars(request.messages)
        return StepOutput(
            message=AssistantMessage(parts=parts),
            usage=Usage(input_tokens=max(1, transcript_chars // 4), output_tokens=max(1, len(encoded) // 4)),
            raw_finish_reason="tool_use",
            finish_reason=FinishReason.TOOL_CALLS,
        )


_BATCH_PREFIX = "scripted-batch:"


class ScriptedBatchAPI(BatchAPI):
    """An offline stand-in for a provider batch API: every request is answered at submit (no simulated
    latency), and the answers travel in the batch id itself, so any worker process can read them back."""

    def __init__(self, script: list[ScriptStep]) -> None:
        self.adapter = ScriptedAdapter([s.model_copy(update={"delta_delay_s": 0.0}) for s in script])

    def submit(self, local_id: str, requests: list[tuple[str, StepRequest]]) -> str:
        answers: dict[str, Any] = {}
        for custom, request in requests:
            try:
                answers[custom] = {
                    "output": self.adapter.stream_step(request, lambda _d: None, lambda: False).model_dump()
                }
            except ProviderError as exc:
                answers[custom] = {"error": [exc.message, exc.retryable, exc.status, exc.code]}
        packed = zlib.compress(json.dumps(answers, separators=(",", ":")).encode())
        return _BATCH_PREFIX + base64.urlsafe_b64encode(packed).decode()

    def poll(self, batch_id: str) -> BatchState:
        return "ended"

    def results(self, batch_id: str) -> dict[str, StepOutput | ProviderError]:
        answers = json.loads(zlib.decompress(base64.urlsafe_b64decode(batch_id.removeprefix(_BATCH_PREFIX))))
        out: dict[str, StepOutput | ProviderError] = {}
        for custom, answer in answers.items():
            if "output" in answer:
                out[custom] = StepOutput.model_validate(answer["output"])
            else:
                message, retryable, status, code = answer["error"]
                out[custom] = ProviderError(message, retryable=retryable, status=status, code=code)
        return out

    def cancel(self, batch_id: str) -> None:
        """Nothing runs in the background: there is nothing to stop."""
