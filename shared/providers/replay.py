"""Replaying an exported case (`stepq export TURN`, stepq.turns.export) offline and deterministically.

`replay_case(case)` runs the case's loop again without Redis, workers or a network: each step asks a model
function (`FunctionModel`'s signature) with the transcript so far, and every tool call it makes is answered
from the results recorded in the case, never run. With no model given, the recorded answers play back
(`recorded_model`), so the replay reproduces the recorded text or object exactly: a check that the case is
whole. Given your own function (a changed prompt's logic, a stand-in for another model), the replay shows what
that would have answered on the same inputs and the same tool results. In pytest:

    replay = replay_case("tests/cases/refund.json", model=my_model)
    assert replay.text == replay.case.result.text
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stepq.models import AssistantMessage, Message, TextPart, ToolCall, ToolResult, ToolResultMessage, ToolResultStatus
from stepq.providers.base import OUTPUT_TOOL
from stepq.providers.function import FunctionRequest, FunctionResponse, ModelFunction
from stepq.providers.scripted import ScriptToolCall

CASE_VERSION = 1
EXTRA_STEPS = 5  # a model under replay may take this many steps more than the recording before it is stopped


class CaseStep(BaseModel):
    step: int
    assistant: AssistantMessage
    tool_results: list[ToolResult] = Field(default_factory=list)


class CaseResult(BaseModel):
    text: str = ""
    object: Any = None


class Case(BaseModel):
    """An exported turn: its input messages, each step's answer and recorded tool results, and its result."""

    stepq_case: int
    turn_id: str
    agent: str
    provider: str
    model: str
    status: str
    finish_reason: str | None = None
    origin: dict[str, Any] | None = None
    input: list[Message]
    steps: list[CaseStep]
    result: CaseResult


class Replay(BaseModel):
    """What a replay produced: the final text or object, the transcript, and the calls nothing recorded."""

    case: Case
    text: str = ""
    object: Any = None
    messages: list[Message]
    steps: int
    unrecorded_calls: list[str] = Field(default_factory=list)  # `name(args)` of calls answered "not recorded"

    @property
    def matches_recording(self) -> bool:
        return self.text == self.case.result.text and self.object == self.case.result.object


def load_case(source: str | Path | dict[str, Any] | Case) -> Case:
    """A case from a file path, a parsed dict, or a Case. ValueError names what is wrong with it."""
    if isinstance(source, Case):
        return source
    data = json.loads(Path(source).read_text(encoding="utf-8")) if isinstance(source, str | Path) else source
    if not isinstance(data, dict) or data.get("stepq_case") != CASE_VERSION:
        raise ValueError(f"not a stepq case (version {CASE_VERSION}): write one with `stepq export TURN -o FILE`")
    return Case.model_validate(data)


def recorded_model(case: Case) -> ModelFunction:
    """A model function answering step n with the case's recorded answer n (text and tool calls, call ids kept)."""

    def answer(request: FunctionRequest) -> FunctionResponse:
        if request.step >= len(case.steps):
            return FunctionResponse(text=case.result.text)
        recorded = case.steps[request.step].assistant
        calls = [ScriptToolCall(name=c.name, args=c.args, id=c.id) for c in recorded.tool_calls]
        return FunctionResponse(text=recorded.text, tool_calls=calls)

    return answer


def _key(name: str, args: Any) -> str:
    return f"{name}({json.dumps(args, sort_keys=True, ensure_ascii=False)})"


def replay_case(source: str | Path | dict[str, Any] | Case, model: ModelFunction | None = None) -> Replay:
    """Run the case's loop offline with `model` (default: the recorded answers), tools answered from the
    recording: the same call (id, tool and arguments), else the same tool and arguments; a call nothing recorded
    gets an error result."""
    case = load_case(source)
    ask = model or recorded_model(case)
    by_id = {r.tool_call_id: r for s in case.steps for r in s.tool_results}
    calls = {c.id: c for s in case.steps for c in s.assistant.tool_calls}
    by_call = {_key(calls[i].name, calls[i].args): r for i, r in by_id.items() if i in calls}
    messages: list[Message] = list(case.input)
    unrecorded: list[str] = []
    for step in range(len(case.steps) + EXTRA_STEPS):
        answer = ask(
            FunctionRequest(messages=list(messages), tools=[], output_schema=None, answer_now=False, step=step)
        )
        if isinstance(answer, str):
            answer = FunctionResponse(text=answer)
        tool_calls = [
            ToolCall(id=c.id or f"call_{step}_{i}", name=c.name, args=c.args if isinstance(c.args, dict) else {})
            for i, c in enumerate(answer.tool_calls)
        ]
        parts: list[Any] = [TextPart(text=answer.text)] if answer.text else []
        messages.append(AssistantMessage(parts=[*parts, *tool_calls]))
        output = next((c for c in tool_calls if c.name == OUTPUT_TOOL), None)
        if output is not None or answer.object is not None or not tool_calls:
            found = output.args if output is not None else answer.object
            return Replay(case=case, text=answer.text, object=found, messages=messages, steps=step + 1,
                          unrecorded_calls=unrecorded)  # fmt: skip
        results = []
        for call in tool_calls:
            key = _key(call.name, call.args)
            same_call = call.id in calls and _key(calls[call.id].name, calls[call.id].args) == key
            recorded = (by_id.get(call.id) if same_call else None) or by_call.get(key)
            if recorded is None:
                unrecorded.append(_key(call.name, call.args))
                recorded = ToolResult(
                    tool_call_id=call.id,
                    name=call.name,
                    output={"error": "not recorded in this case: the replay runs no tools"},
                    is_error=True,
                    status=ToolResultStatus.FAILED,
                )
            results.append(recorded.model_copy(update={"tool_call_id": call.id}))
        messages.append(ToolResultMessage(results=results))
    raise ValueError(f"case {case.turn_id}: the model kept calling tools past {len(case.steps) + EXTRA_STEPS} steps")
