"""Tool-call pairing in a caller's transcript: every call answered, every result naming a call.

A provider refuses a transcript whose tool calls are not each answered by the tool message right after
them (Anthropic, Bedrock and OpenAI with a 400, Gemini with a confused model), so `submit(messages=...)`
refuses one at the door, naming the entries, instead of failing the turn's first step. A turn's own
`TurnResult.messages` is always paired (`stepq.models.closed_transcript`); a turn that waits for client-side
tool results is continued with `Client.resume`, not by submitting its open calls again.
"""

from __future__ import annotations

from stepq.errors import TranscriptError
from stepq.models import AssistantMessage, Message, ToolCall, ToolResultMessage

_SHOWN = 5  # problems named in one error; the rest are counted


def unpaired(messages: list[Message]) -> list[str]:
    """Each problem as `messages[i]...: what`, in transcript order; empty when every call is paired."""
    problems: list[str] = []
    open_calls: dict[str, tuple[int, ToolCall]] = {}  # the latest assistant message's calls not yet answered
    answered: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message, ToolResultMessage):
            for j, result in enumerate(message.results):
                call_id = result.tool_call_id
                if call_id in open_calls:
                    del open_calls[call_id]
                    answered.add(call_id)
                elif call_id in answered:
                    problems.append(f"messages[{i}].results[{j}]: a second result for tool call {call_id!r}")
                else:
                    problems.append(f"messages[{i}].results[{j}]: result for {call_id!r} pairs with no tool call")
            continue
        problems.extend(_open(open_calls))  # any other message closes the previous message's calls
        open_calls, answered = {}, set()
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                if call.id in open_calls:
                    problems.append(f"messages[{i}]: two tool calls share the id {call.id!r}")
                open_calls[call.id] = (i, call)
    problems.extend(_open(open_calls))
    return problems


def _open(open_calls: dict[str, tuple[int, ToolCall]]) -> list[str]:
    return [f"messages[{i}]: tool call {call.id!r} ({call.name}) has no result" for i, call in open_calls.values()]


def check_pairing(messages: list[Message]) -> None:
    """Raise TranscriptError naming the unpaired entries (one line), or return."""
    problems = unpaired(messages)
    if not problems:
        return
    more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    raise TranscriptError(
        "unpaired tool calls in messages: "
        + "; ".join(problems[:_SHOWN])
        + more
        + ". Answer each call in a tool message right after it (TurnResult.messages is always paired; "
        "a turn waiting for client-side tool results continues with Client.resume)",
        entries=problems,
    )
