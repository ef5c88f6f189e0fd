"""What the operator console reads besides the listings: a turn's per-step trace (what `stepq show --trace`
prints) and a batch's progress (what `stepq batch status` prints), both scoped to the caller's tenant."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from stepq.batches import driver as batch_driver
from stepq.batches.items import check_batch_id
from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.routes_turns import gateway
from stepq.producer.gateway.service import Gateway

router = APIRouter(tags=["turns"])


@router.get("/v1/turns/{turn_id}/trace")
async def trace(
    turn_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> dict[str, Any]:
    """One row per model step: provider and model, attempts that failed (and on whom, after a failover),
    retries, tool calls and how each ended, usage and cost, duration and why the step stopped."""
    state = await gw.owned_turn(turn_id, principal)
    return {"turn_id": turn_id, "steps": state.trace.model_dump(mode="json")["steps"]}


def _not_found(batch_id: str) -> GatewayError:
    return GatewayError(404, "not-found", f"no batch {batch_id!r} (unknown, expired, or not yours)")


@router.get("/v1/batches/{batch_id}", tags=["batches"])
async def batch_status(
    batch_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> dict[str, Any]:
    """A batch's counters (total, done, failed, running, retrying, awaiting approval, tokens). A batch is
    yours when its turns are: the tenant's turn listing must hold one of them."""
    try:
        check_batch_id(batch_id)
    except ValueError:
        raise _not_found(batch_id) from None
    mine = await gw.run_sync(lambda: gw.client.list_turns(tenant=principal.tenant, batch=batch_id, limit=1))
    if not mine.items:
        raise _not_found(batch_id)
    try:
        return await gw.run_sync(batch_driver.status, gw.runtime, batch_id)
    except LookupError:
        raise _not_found(batch_id) from None
