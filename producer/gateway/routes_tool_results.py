"""Answering a turn's client-side tool calls over HTTP: `POST /v1/turns/{id}/tool-results`.

The same path as `Client.resume`: every open call answered at once, each only once (one Lua script checks
and stores them), refused before the model is asked. Another tenant's turn is a 404, like an unknown one.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.routes_turns import gateway
from stepq.producer.gateway.service import Gateway

router = APIRouter(prefix="/v1/turns", tags=["turns"])


class ToolResultsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    results: dict[str, Any] = Field(description="one entry per open call: tool_call_id -> the tool's output (JSON)")
    errors: list[str] = Field(default_factory=list, description="call ids whose output is an error message")


@router.post("/{turn_id}/tool-results")
async def tool_results(
    turn_id: str,
    body: ToolResultsBody,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """Supply the results of the turn's client-side tool calls (listed by its `tool-results-request` event and
    `pending_tool_calls`); its loop goes on. Refused: 422 `unknown-call` / `missing-results` /
    `invalid-result`, 409 `already-answered` / `expired` / `turn-not-waiting`, each naming the call ids."""
    await gw.owned_turn(turn_id, principal)
    await gw.run_sync(lambda: gw.client.resume(turn_id, body.results, errors=body.errors, tenant=principal.tenant))
    return {"turn_id": turn_id, "accepted": sorted(body.results), "events_url": f"/v1/turns/{turn_id}/events"}
