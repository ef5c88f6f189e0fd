"""Deciding an approval as the authenticated principal. The signed token never leaves the server: it is
read from the pending approval's record and sent, with the decision, to the worker's `approve` task, which
still verifies it (HMAC, arguments hash, once only, expiry)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.routes_turns import gateway
from stepq.producer.gateway.service import Gateway
from stepq.turns import listings

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])

DECISION_TIMEOUT_S = 30.0


class DecisionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    approved: bool
    reason: str = Field(default="", max_length=2000)
    args: dict[str, Any] | None = Field(
        default=None, description="approve with these arguments instead (tools declared editable=True)"
    )


@router.get("")
async def list_approvals(
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("review", "approve"))],
    state: Annotated[
        Literal["pending", "decided"], Query(description="waiting for a reviewer, or decided")
    ] = "pending",
    turn: Annotated[str | None, Query(description="only this turn's")] = None,
    cursor: Annotated[str | None, Query(description="the previous page's next_cursor")] = None,
    limit: Annotated[int, Query(ge=1, le=listings.MAX_LIMIT)] = listings.DEFAULT_LIMIT,
) -> dict[str, Any]:
    """Your tenant's approval inbox: pending approvals newest first (tool, arguments as you decide on them, turn,
    expiry), or decided ones latest first (decision, who, when). Needs the `review` or `approve` scope."""
    page = await gw.run_sync(
        lambda: listings.list_approvals(
            gw.runtime, principal.tenant, pending=state == "pending", turn=turn, cursor=cursor, limit=limit
        )
    )
    return page.model_dump(mode="json")


@router.post("/{approval_id}")
async def decide(
    approval_id: str,
    body: DecisionBody,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("approve"))],
) -> dict[str, Any]:
    """Approve or deny a gated tool call; the reviewer recorded is the caller. A refusal is a 409 whose
    code says why (`expired`, `not-pending`, `changed-args`, `invalid-args`, `invalid-token`, `unknown`).
    `args` approves an editable tool's call with edited arguments (validated against its schema, re-bound)."""
    record = await gw.run_sync(gw.runtime.approvals.get, approval_id)
    if record is None or await gw.turn_tenant(record.turn_id) != principal.tenant:
        raise GatewayError(404, "not-found", f"no approval {approval_id!r} (unknown, expired, or not yours)")
    receipt = await gw.run_sync(
        lambda: gw.client.approve(
            approval_id,
            body.approved,
            token=record.token,
            reason=body.reason,
            reviewer=principal.subject,
            args=body.args,
        )
    )
    try:
        await gw.run_sync(receipt.wait, DECISION_TIMEOUT_S)
    except TimeoutError:
        raise GatewayError(
            503, "unavailable", f"no worker answered within {DECISION_TIMEOUT_S:.0f}s; is `stepq worker` running?"
        ) from None
    return {
        "approval_id": approval_id,
        "turn_id": record.turn_id,
        "decision": "approved" if body.approved else "denied",
        "reviewer": principal.subject,
    }
