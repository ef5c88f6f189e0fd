"""Client-side tool outputs in a chat: the AI SDK's `addToolOutput` answers, sent back in the assistant message.

A `useChat` client runs a client-side tool when its part arrives as `input-available` (the turn parked on a
`tool-results-request`), and its next request carries the assistant message with that part in state
`output-available` (`output`) or `output-error` (`errorText`). The message holds every tool part of the
turn, server-run ones included, so only the parts answering the turn's open client-side calls that have no
result yet count; they go through `Client.resume`, with its once-only checks and refusals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from stepq.producer.gateway.auth import Principal
from stepq.producer.gateway.service import Gateway


@dataclass
class Outputs:
    results: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.results)


def _tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    parts = message.get("parts") or []
    return [
        p
        for p in parts
        if isinstance(p, dict) and (str(p.get("type", "")).startswith("tool-") or p.get("type") == "dynamic-tool")
    ]


async def new_outputs(gw: Gateway, turn_id: str, message: dict[str, Any]) -> Outputs:
    """The message's outputs for the turn's open client-side calls that have no stored result yet."""
    state = await gw.run_sync(gw.runtime.turns.load, turn_id)
    if state is None or not state.status.parked or state.parked is None or not state.parked.client_calls:
        return Outputs()
    open_ids = [c.tool_call_id for c in state.parked.client_calls]
    if time.time() >= state.parked.client_calls[0].expires_at:
        return Outputs()
    stored = await gw.run_sync(gw.runtime.tool_results.get_many, turn_id, open_ids)
    found = Outputs()
    for part in _tool_parts(message):
        call_id = part.get("toolCallId")
        if call_id not in open_ids or call_id in stored:
            continue
        if part.get("state") == "output-available":
            found.results[call_id] = part.get("output")
        elif part.get("state") == "output-error":
            found.results[call_id] = str(part.get("errorText") or "the client-side tool failed")
            found.errors.append(call_id)
    return found


async def supply(gw: Gateway, principal: Principal, turn_id: str, outputs: Outputs) -> None:
    """Store them once (a refusal is the JSON error of `POST /v1/turns/{id}/tool-results`) and resume."""
    await gw.run_sync(
        lambda: gw.client.resume(turn_id, outputs.results, errors=outputs.errors, tenant=principal.tenant)
    )
