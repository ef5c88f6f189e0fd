"""Answering a turn's client-side tool calls (`Client.resume`, `POST /v1/turns/{id}/tool-results`).

The caller sends one result per open call, all at once. Everything that can be checked without the turn's
state (a mapping of call ids to JSON values, `errors` naming only given calls) is checked here; the rest
(the calls are open, none answered yet, none left out, not expired) is checked and stored by one Lua
script (ToolResultStore.submit_client), so two concurrent submits cannot both win. Nothing reaches the
model before every check passed: a refusal raises ToolResultsError and stores nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import Any

from stepq.errors import ToolResultsError, ToolResultsRefusal, TurnNotFoundError
from stepq.fleet.runtime import Runtime
from stepq.models import PendingToolCall, ToolResult, ToolResultStatus, TurnState

_SHOWN = 10  # call ids named in one message


def open_calls(state: TurnState) -> list[PendingToolCall]:
    """The client-side calls a parked turn waits for (their results may already be in: see client_results_in)."""
    if not state.status.parked or state.parked is None:
        return []
    return list(state.parked.client_calls)


def client_results_in(rt: Runtime, state: TurnState, now: float) -> bool:
    """Every client-side call of the parked step has its result stored, or has expired."""
    calls = open_calls(state)
    if not calls or now >= calls[0].expires_at:
        return True
    stored = rt.tool_results.get_many(state.turn_id, [c.tool_call_id for c in calls])
    return len(stored) == len(calls)


def submit_results(
    rt: Runtime,
    turn_id: str,
    results: Mapping[str, Any],
    errors: Collection[str] = (),
    *,
    tenant: str | None = None,
) -> TurnState:
    """Store the results of the turn's open client-side calls, once; returns the turn as it was before.

    Raises TurnNotFoundError (unknown, expired, or with `tenant`, another tenant's) and ToolResultsError
    (its `code` a ToolResultsRefusal, `call_ids` the calls concerned); nothing is stored then."""
    state = rt.turns.load(turn_id) if isinstance(turn_id, str) and turn_id else None
    if state is None or (tenant is not None and state.metadata.get("tenant") != tenant):
        raise TurnNotFoundError(f"no turn {turn_id!r} (unknown, or expired after its TTL)")
    if not isinstance(results, Mapping) or not results or not all(isinstance(k, str) for k in results):
        raise ToolResultsError(
            ToolResultsRefusal.INVALID, "results must be a non-empty mapping of tool call id -> the tool's output"
        )
    errors = list(errors or ())
    stray = [e for e in errors if e not in results]
    if stray:
        raise ToolResultsError(
            ToolResultsRefusal.INVALID, f"errors names calls with no result given: {_ids(stray)}", stray
        )
    names = {c.tool_call_id: c.tool_name for c in open_calls(state)}
    limit = rt.settings.max_tool_result_chars
    encoded = {
        call_id: _result(call_id, names.get(call_id, ""), output, call_id in errors, limit).model_dump_json()
        for call_id, output in results.items()
    }
    code, ids = rt.tool_results.submit_client(turn_id, encoded, time.time())
    if code:
        raise ToolResultsError(code, _refusal_message(code, state, ids), ids)
    return state


def _result(call_id: str, name: str, output: Any, is_error: bool, limit: int) -> ToolResult:
    """The stored result: JSON only (NaN and objects JSON cannot carry are refused), cut like a tool's own."""
    try:
        text = json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolResultsError(
            ToolResultsRefusal.INVALID,
            f"the result for {call_id!r} is not JSON ({exc}); send numbers, strings, lists, objects or null",
            [call_id],
        ) from None
    if len(text) > limit:  # as a tool's own oversized result: cut with a marker (STEPQ_MAX_TOOL_RESULT_CHARS)
        output = text[:limit] + f"…[truncated {len(text) - limit} chars]"
    failed = ToolResultStatus.FAILED
    if is_error and not (isinstance(output, dict) and "error" in output):
        output = {"error": output if isinstance(output, str) else json.dumps(output), "status": failed.value}
    status = failed if is_error else ToolResultStatus.OK
    return ToolResult(tool_call_id=call_id, name=name, output=output, is_error=is_error, status=status)


def _refusal_message(code: str, state: TurnState, ids: list[str]) -> str:
    turn = state.turn_id
    waiting = [c.tool_call_id for c in open_calls(state)]
    if code == ToolResultsRefusal.UNKNOWN_CALL:
        return f"turn {turn} waits for no tool call {_ids(ids)}; its open calls are {_ids(waiting) or 'none'}"
    if code == ToolResultsRefusal.ALREADY_ANSWERED:
        return f"tool call {_ids(ids)} of turn {turn} already has its result (results are taken once)"
    if code == ToolResultsRefusal.MISSING:
        return f"no result for open tool call {_ids(ids)} of turn {turn}; send one result per open call, all at once"
    if code == ToolResultsRefusal.EXPIRED:
        return f"turn {turn}'s client-side tool calls expired; the model is told no result came"
    return f"turn {turn} waits for no client-side tool results (it is {state.status.value} or moved on)"


def _ids(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:_SHOWN])
    return shown + (f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")
