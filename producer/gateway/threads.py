"""Threads over HTTP: a conversation whose transcript the server keeps, continued one turn at a time.

Every thread belongs to the creator's tenant; another tenant's thread id answers 404, exactly like an
unknown one. Continuing a thread while one of its turns runs follows `multitask`: `reject` (409),
`enqueue` or `interrupt` (see `stepq.turns.threads`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.service import Gateway
from stepq.turns import listings
from stepq.turns.threads import Multitask, Thread

router = APIRouter(prefix="/v1/threads", tags=["threads"])


def gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str
    metadata: dict[str, Any] | None = None


class ContinueBody(BaseModel):
    """The next message(s): exactly one of `prompt` or `messages`, validated as for a turn."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    messages: list[Any] | None = None
    multitask: Multitask = Multitask.REJECT
    context: dict[str, Any] | None = Field(
        default=None,
        description="this turn's runtime context for the agent's tools, checked against its context_schema",
    )


class Created(BaseModel):
    thread_id: str
    agent: str
    created_at: float


class Continued(BaseModel):
    turn_id: str
    thread_id: str
    status: str  # `queued` (runs now) or `waiting` (behind the running turn)
    events_url: str


def _describe(thread: Thread) -> dict[str, Any]:
    """What a caller sees: the transcript and turns; the tenant is the caller's own, so it is left out."""
    return thread.model_dump(mode="json", exclude={"tenant"})


@router.post("", status_code=201, response_model=Created)
async def create(
    body: CreateBody,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
) -> Created:
    """Start a conversation with an agent; it keeps its transcript for STEPQ_THREAD_TTL_S after its last use."""
    thread = await gw.run_sync(
        lambda: gw.client.create_thread(body.agent, metadata=body.metadata, tenant=principal.tenant)
    )
    return Created(thread_id=thread.thread_id, agent=thread.agent, created_at=thread.created_at)


@router.get("")
async def list_threads(
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
    cursor: Annotated[str | None, Query(description="the previous page's next_cursor")] = None,
    limit: Annotated[int, Query(ge=1, le=listings.MAX_LIMIT)] = listings.DEFAULT_LIMIT,
) -> dict[str, Any]:
    """Your tenant's threads, most recently active first: title, agent, turns, and whether one runs now."""
    page = await gw.run_sync(lambda: gw.client.list_threads(tenant=principal.tenant, cursor=cursor, limit=limit))
    return page.model_dump(mode="json")


@router.get("/{thread_id}")
async def read(
    thread_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> dict[str, Any]:
    """The thread's transcript (every turn that ended, folded in) and its turns, oldest first."""
    thread = await gw.run_sync(lambda: gw.client.get_thread(thread_id, tenant=principal.tenant))
    return _describe(thread)


@router.post("/{thread_id}/turns", status_code=201, response_model=Continued)
async def continue_(
    thread_id: str,
    body: ContinueBody,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
    traceparent: Annotated[str | None, Header()] = None,
) -> Continued:
    """The thread's next turn: the model sees the thread's transcript, then these messages."""
    handle = await gw.run_sync(  # ThreadNotFoundError answers 404, ThreadBusyError 409 (see errors.py)
        lambda: gw.client.continue_thread(
            thread_id,
            prompt=body.prompt,
            messages=body.messages,
            multitask=body.multitask,
            tenant=principal.tenant,
            policy=principal.policy,
            traceparent=traceparent,  # the caller's W3C trace context: the turn's spans join it
            context=body.context,
        )
    )
    stored = await gw.run_sync(gw.runtime.threads.load, thread_id)
    status = "waiting" if stored is not None and handle.turn_id in stored.queue else "queued"
    return Continued(
        turn_id=handle.turn_id, thread_id=thread_id, status=status, events_url=f"/v1/turns/{handle.turn_id}/events"
    )
