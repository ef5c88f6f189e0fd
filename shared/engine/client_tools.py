"""Client-side tool calls in a step: parked like approvals, answered by the turn's caller.

A tool declared `client=True` (or with `client_tool`) has no implementation on the workers. When the model
calls one, the step parks (status `awaiting_tool_results`, a `tool-results-request` event listing the open
calls) and holds no worker; `Client.resume` stores the results once (stepq.turns.client_results) and re-enqueues the
step, which reads them here as it reads any stored result. Calls still open at their expiry resolve as
errors the model reads, exactly as an expired approval resolves as a denial.
"""

from __future__ import annotations

from typing import Any

from stepq.engine.dispatch import PreparedCall, StepDispatcher
from stepq.models import ParkedStep, PendingToolCall, ToolResult, ToolResultStatus


def pending(waiting: list[PreparedCall], expires_at: float) -> list[PendingToolCall]:
    """The client-side calls among a step's waiting calls, each with the validated arguments the caller sees."""
    return [
        PendingToolCall(tool_call_id=p.call.id, tool_name=p.call.name, args=p.args or {}, expires_at=expires_at)
        for p in waiting
        if p.is_client
    ]


def request_event(calls: list[PendingToolCall]) -> dict[str, Any]:
    """The `tool-results-request` event: every open call, and until when a result is taken."""
    return {
        "calls": [{"tool_call_id": c.tool_call_id, "tool": c.tool_name, "args": c.args} for c in calls],
        "expires_at": calls[0].expires_at,
    }


def settle(parked: ParkedStep, dispatcher: StepDispatcher, now: float) -> dict[str, ToolResult] | None:
    """The results of the parked step's client-side calls by call id, or None while some still wait for their
    caller (and have not expired). A call still open at its expiry gets an error result, stored like any."""
    if not parked.client_calls:
        return {}
    ids = {c.tool_call_id for c in parked.client_calls}
    calls = [c for c in parked.assistant.tool_calls if c.id in ids]
    stored = dispatcher.stored(calls)
    missing = [c for c in calls if c.id not in stored]
    if missing and now < parked.client_calls[0].expires_at:
        return None
    for call in missing:
        error = "no result: the client-side tool call expired before its caller answered it"
        stored[call.id] = dispatcher.record(
            ToolResult(
                tool_call_id=call.id,
                name=call.name,
                output={"error": error, "status": ToolResultStatus.FAILED.value},
                is_error=True,
                status=ToolResultStatus.FAILED,
            )
        )
    return stored
