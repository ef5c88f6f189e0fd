"""A thread's transcript as AI SDK UIMessages: what a chat page (or `useChat({messages})`) starts from.

Each finished turn is a user message followed by one assistant message whose id is the turn id, the same
id its live stream used, so a page that saw the turn stream and one that loads it afterwards agree.
"""

from __future__ import annotations

from typing import Any

from stepq.models import (
    AssistantMessage,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolResultStatus,
    TurnState,
    UserMessage,
)
from stepq.turns.threads import Thread

UIMessage = dict[str, Any]
_TERMINAL = {"completed", "failed", "cancelled", "expired"}


def ui_messages(thread: Thread, running: TurnState | None) -> list[UIMessage]:
    """The finished turns, then the running turn's question (its answer streams from the resume endpoint)."""
    finished = [t.turn_id for t in thread.turns if t.status in _TERMINAL]
    out: list[UIMessage] = []
    groups = _by_question(thread.messages)
    for index, (question, answer) in enumerate(groups):
        turn_id = finished[index] if len(finished) == len(groups) else f"{thread.thread_id}-{index}"
        if question is not None:
            out.append(_user(f"{turn_id}-user", question.content))
        if answer:
            out.append(_assistant(turn_id, answer))
    if running is not None:
        for offset, message in enumerate(running.messages[len(thread.messages) :]):
            if isinstance(message, UserMessage):
                out.append(_user(f"{running.turn_id}-user" + (f"-{offset}" if offset else ""), message.content))
    return out


def _by_question(messages: list[Message]) -> list[tuple[UserMessage | None, list[Message]]]:
    """Split a transcript at each user message: (the question, what answered it)."""
    groups: list[tuple[UserMessage | None, list[Message]]] = []
    for message in messages:
        if isinstance(message, UserMessage):
            groups.append((message, []))
        elif isinstance(message, AssistantMessage | ToolResultMessage):
            if not groups:
                groups.append((None, []))
            groups[-1][1].append(message)
    return groups


def _user(message_id: str, text: str) -> UIMessage:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def _assistant(turn_id: str, messages: list[Message]) -> UIMessage:
    parts: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    for message in messages:
        if isinstance(message, AssistantMessage):
            parts.append({"type": "step-start"})
            for part in message.parts:
                if isinstance(part, TextPart) and part.text:
                    parts.append({"type": "text", "text": part.text, "state": "done"})
                elif isinstance(part, ReasoningPart) and part.text:
                    parts.append({"type": "reasoning", "text": part.text, "state": "done"})
                elif isinstance(part, ToolCall):
                    tool = {
                        "type": f"tool-{part.name}",
                        "toolCallId": part.id,
                        "state": "input-available",
                        "input": part.args,
                    }
                    tools[part.id] = tool
                    parts.append(tool)
        elif isinstance(message, ToolResultMessage):
            for result in message.results:
                if result.tool_call_id in tools:
                    _settle(tools[result.tool_call_id], result)
    return {"id": turn_id, "role": "assistant", "parts": parts}


def _settle(tool: dict[str, Any], result: ToolResult) -> None:
    if not result.is_error:
        tool.update(state="output-available", output=result.output)
    elif result.status == ToolResultStatus.DENIED:
        tool.update(state="output-denied")
    else:
        error = result.output.get("error") if isinstance(result.output, dict) else result.output
        tool.update(state="output-error", errorText=str(error))
