"""Turns: submit, read, stream events (SSE), cancel. Every turn belongs to the submitter's tenant."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from stepq.errors import SubmitError
from stepq.models import ParkedStep, TurnState
from stepq.producer.gateway import sse
from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.service import Gateway, not_found_turn
from stepq.producer.gateway.streams import follow_batches
from stepq.turns import listings
from stepq.turns.listings import origin_of

router = APIRouter(prefix="/v1/turns", tags=["turns"])


def gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


class SubmitBody(BaseModel):
    """A turn to run: exactly one of `prompt` or `messages` (validated exactly as `Client.submit` does)."""

    model_config = ConfigDict(extra="forbid")

    agent: str
    prompt: str | None = None
    messages: list[Any] | None = None
    idempotency_key: str | None = None
    metadata: dict[str, Any] | None = None
    loop: dict[str, Any] | None = Field(default=None, description="overrides that may only tighten the agent's loop")
    provider: str | None = Field(default=None, description="this turn's provider, if the agent and policies allow")
    model: str | None = Field(default=None, description="this turn's model (`provider/model` allowed), likewise")
    context: dict[str, Any] | None = Field(
        default=None, description="the runtime context the agent's tools read, checked against its context_schema"
    )
    defer_tools: bool = Field(
        default=False,
        description="park every tool call for the caller (POST /v1/turns/{id}/tool-results); approvals still apply",
    )


class Submitted(BaseModel):
    turn_id: str
    status: str
    created: bool
    events_url: str


def tenant_scoped_key(tenant: str, key: str | None) -> str | None:
    """Idempotency keys are per tenant: two tenants using the same key get two turns, and neither learns
    of the other's. (Checked for length first, so the caller sees the library's own message.)"""
    if key is None:
        return None
    if not isinstance(key, str) or not 0 < len(key) <= 200:
        raise SubmitError("idempotency_key must be a string of 1 to 200 characters")
    return "gw-" + hashlib.sha256(f"{tenant}\x1f{key}".encode()).hexdigest()


@router.post("", status_code=201, response_model=Submitted, responses={200: {"model": Submitted}})
async def submit(
    body: SubmitBody,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
    idempotency_header: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    traceparent: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Validate, store and enqueue a turn. A repeated idempotency key answers 200 with the same turn."""
    if idempotency_header is not None and body.idempotency_key not in (None, idempotency_header):
        raise GatewayError(400, "bad-request", "the Idempotency-Key header and body.idempotency_key differ")
    key = tenant_scoped_key(principal.tenant, idempotency_header or body.idempotency_key)
    metadata = dict(body.metadata or {})
    if metadata.get("tenant", principal.tenant) != principal.tenant:
        raise GatewayError(400, "bad-request", "metadata.tenant is set from your credential; leave it out")
    metadata["tenant"] = principal.tenant
    handle = await gw.run_sync(
        lambda: gw.client.submit(
            body.agent,
            prompt=body.prompt,
            messages=body.messages,
            idempotency_key=key,
            metadata=metadata,
            loop=body.loop,
            provider=body.provider,
            model=body.model,
            policy=principal.policy,
            traceparent=traceparent,  # the caller's W3C trace context: the turn's spans join it
            context=body.context,
            defer_tools=body.defer_tools,
        )
    )
    state = await gw.run_sync(handle.get)
    answer = Submitted(
        turn_id=handle.turn_id,
        status=state.status.value,
        created=handle.created,
        events_url=f"/v1/turns/{handle.turn_id}/events",
    )
    return JSONResponse(answer.model_dump(), status_code=201 if handle.created else 200)


def describe(state: TurnState) -> dict[str, Any]:
    """What a caller may see of a turn: no approval tokens, no secrets, no internal bookkeeping."""
    out: dict[str, Any] = {
        "turn_id": state.turn_id,
        "agent": state.agent,
        "status": state.status.value,
        "step": state.step,
        "provider": state.provider,
        "model": state.model,
        "metadata": state.metadata,
        "usage": state.usage.model_dump(),
        "created_at": state.created_at,
        "updated_at": state.updated_at,
        "finished_at": state.finished_at,
        "origin": origin_of(state),
    }
    if state.parked is not None and not state.status.terminal:
        out["pending_approvals"] = pending_approvals(state.parked)
        out["pending_tool_calls"] = [  # client-side calls: answer them with POST /v1/turns/{id}/tool-results
            {"tool_call_id": c.tool_call_id, "tool": c.tool_name, "args": c.args, "expires_at": c.expires_at}
            for c in state.parked.client_calls
        ]
    if state.plan is not None:  # the agent's visible task plan: progress, shown while the turn runs too
        out["plan"] = [s.model_dump(exclude_none=True) for s in state.plan]
    if state.status.terminal:
        out["result"] = {
            "text": state.text,
            "object": state.object,
            "finish_reason": state.finish_reason.value if state.finish_reason else None,
            "error": state.error,
        }
    return out


def pending_approvals(parked: ParkedStep) -> list[dict[str, Any]]:
    """What a reviewer decides on: the tool, its arguments as the approval request showed them, the expiry.
    (A step parked by an older worker kept no arguments with its approvals: the call's own are shown.)"""
    called = {c.id: c.args for c in parked.assistant.tool_calls}
    return [
        {
            "approval_id": a.approval_id,
            "tool_call_id": a.tool_call_id,
            "tool": a.tool_name,
            "args": a.args if a.args is not None else called.get(a.tool_call_id, {}),
            "expires_at": a.expires_at,
        }
        for a in parked.approvals
    ]


@router.get("")
async def list_turns(
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
    status: Annotated[str | None, Query(description="queued, running, awaiting_approval, completed, ...")] = None,
    agent: str | None = None,
    thread: str | None = None,
    batch: str | None = None,
    since: Annotated[float | None, Query(description="created at or after this unix time (seconds)")] = None,
    cursor: Annotated[str | None, Query(description="the previous page's next_cursor")] = None,
    limit: Annotated[int, Query(ge=1, le=listings.MAX_LIMIT)] = listings.DEFAULT_LIMIT,
) -> dict[str, Any]:
    """Your tenant's turns, newest first, filtered; `next_cursor` (null on the last page) gets the next page."""
    page = await gw.run_sync(
        lambda: gw.client.list_turns(
            tenant=principal.tenant,
            status=status,
            agent=agent,
            thread=thread,
            batch=batch,
            since=since,
            cursor=cursor,
            limit=limit,
        )
    )
    return page.model_dump(mode="json")


@router.get("/{turn_id}")
async def get_turn(
    turn_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> dict[str, Any]:
    """The turn's state and usage, and its result once it has finished."""
    return describe(await gw.owned_turn(turn_id, principal))


def parse_cursor(raw: str | None, source: str) -> int | None:
    if raw is None:
        return None
    value = raw.strip()
    if not value.isdigit():
        raise GatewayError(
            400, "invalid-cursor", f"{source} must be a non-negative integer event seq (got {raw[:40]!r})"
        )
    return int(value)


@router.get(
    "/{turn_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "id: <seq>, event: <type>, data: <json>"}},
)
async def events(
    turn_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
    after: Annotated[str | None, Query(description="resume after this seq (the Last-Event-ID header wins)")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> StreamingResponse:
    """Server-sent events: every event after the cursor, once each, in order; ends after `turn-finish`."""
    cursor = parse_cursor(last_event_id, "Last-Event-ID")
    if cursor is None:
        cursor = parse_cursor(after, "after")
    cursor = cursor or 0
    tenant, last = await gw.reader.owner_and_last_seq(turn_id)
    if tenant != principal.tenant:
        raise not_found_turn(turn_id)
    if cursor > last:
        raise GatewayError(
            400, "invalid-cursor", f"cursor {cursor} is past the end of turn {turn_id}'s events (last seq {last})"
        )
    return StreamingResponse(
        _stream(gw, turn_id, cursor),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(gw: Gateway, turn_id: str, cursor: int) -> AsyncIterator[bytes]:
    metrics = gw.metrics
    metrics.open_streams.inc()
    started = time.monotonic()
    try:
        yield sse.comment(f"turn {turn_id}")  # headers and a first byte now: proxies and clients see a live stream
        async for batch in follow_batches(gw.hub, gw.reader, turn_id, cursor, gw.settings.gateway_keepalive_s):
            yield sse.encode_all(batch) if batch else sse.KEEPALIVE
    finally:
        metrics.open_streams.dec()
        metrics.stream_duration.observe(time.monotonic() - started)


class ForkBody(BaseModel):
    """Fork a turn from a step: its transcript up to `from_step`, then the model asked again from there."""

    model_config = ConfigDict(extra="forbid")

    from_step: int
    prompt: str | None = Field(default=None, description="replaces the last user message before the step")
    overrides: dict[str, Any] | None = Field(default=None, description="loop overrides that may only tighten")
    model: str | None = Field(default=None, description="another model (`provider/model` allowed), if allowed")


@router.post("/{turn_id}/fork", status_code=201)
async def fork(
    turn_id: str,
    body: ForkBody,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """A new turn from step `from_step` of this one (its stored tool results reused, never run again)."""
    await gw.owned_turn(turn_id, principal)
    handle = await gw.run_sync(
        lambda: gw.client.fork(
            turn_id,
            from_step=body.from_step,
            prompt=body.prompt,
            overrides=body.overrides,
            model=body.model,
            tenant=principal.tenant,
            policy=principal.policy,
        )
    )
    return {
        "turn_id": handle.turn_id,
        "origin": {"turn_id": turn_id, "step": body.from_step},
        "events_url": f"/v1/turns/{handle.turn_id}/events",
    }


@router.post("/{turn_id}/cancel", status_code=202)
async def cancel(
    turn_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """Ask the turn to stop: a running step stops between deltas; a queued or parked turn ends at once."""
    state = await gw.owned_turn(turn_id, principal)
    await gw.run_sync(gw.client.cancel, turn_id)
    return {"turn_id": turn_id, "status": state.status.value, "cancel_requested": not state.status.terminal}
