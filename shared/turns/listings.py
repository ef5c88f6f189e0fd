"""Listing a tenant's turns, approvals and threads: pages of the indexes (stepq.store.listings), each id read
back from its own record, so a page shows what is stored now and never what an index entry remembers.

A listed item whose record expired is dropped from the page (and a turn's entry from the index); one whose
record no longer matches the filter (an index entry behind a status change that has not reached it yet) is
left out. Approval tokens never appear: an approval shows what its reviewer decides on.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, cast

from pydantic import BaseModel

from stepq.errors import SubmitError
from stepq.fleet.runtime import Runtime
from stepq.models import TurnState, TurnStatus, UserMessage
from stepq.store.listings import batch_of, tenant_of

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
TITLE_MESSAGES = 4  # a thread's title comes from its first user message, among its first few


class TurnItem(BaseModel):
    turn_id: str
    agent: str
    tenant: str
    thread_id: str | None
    batch_id: str | None
    status: str
    step: int
    created_at: float
    updated_at: float
    finish_reason: str | None
    origin: dict[str, Any] | None  # a forked turn's {turn_id, step}


class ApprovalItem(BaseModel):
    approval_id: str
    turn_id: str
    agent: str
    tenant: str
    call_id: str
    tool: str
    args: dict[str, Any]  # as the reviewer is shown them (never the approval token)
    created_at: float
    expires_at: float
    state: str  # pending | decided
    decision: str | None  # approved | denied | expired | cancelled
    decided_by: str | None
    decided_at: float | None


class ThreadItem(BaseModel):
    thread_id: str
    tenant: str
    agent: str
    title: str
    last_activity: float
    turns: int
    status: str  # running | idle


class Listing(BaseModel):
    """One page, newest first; pass `next_cursor` back for the next (None: there is no more)."""

    items: list[TurnItem] | list[ApprovalItem] | list[ThreadItem]
    next_cursor: str | None


def check_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise SubmitError(f"limit must be an integer from 1 to {MAX_LIMIT} (got {limit!r})")
    return limit


def _status(value: str | TurnStatus | None) -> TurnStatus | None:
    if value is None or isinstance(value, TurnStatus):
        return value
    try:
        return TurnStatus(value)
    except ValueError:
        known = ", ".join(s.value for s in TurnStatus)
        raise SubmitError(f"unknown status {value!r}; known: {known}") from None


def _cursor_error(exc: ValueError) -> SubmitError:
    return SubmitError(str(exc))


def origin_of(state: TurnState) -> dict[str, Any] | None:
    """A forked turn's origin (stepq.turns.fork stamps it in the metadata): {turn_id, step}."""
    origin = state.metadata.get("origin")
    return cast(dict[str, Any], origin) if isinstance(origin, dict) else None


def turn_item(state: TurnState) -> TurnItem:
    return TurnItem(
        turn_id=state.turn_id,
        agent=state.agent,
        tenant=tenant_of(state),
        thread_id=state.thread_id,
        batch_id=batch_of(state) or None,
        status=state.status.value,
        step=state.step,
        created_at=state.created_at,
        updated_at=state.updated_at,
        finish_reason=state.finish_reason.value if state.finish_reason else None,
        origin=origin_of(state),
    )


def list_turns(
    rt: Runtime,
    tenant: str,
    *,
    status: str | TurnStatus | None = None,
    agent: str | None = None,
    thread: str | None = None,
    batch: str | None = None,
    since: float | None = None,
    cursor: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Listing:
    """The tenant's turns, newest first (by creation), filtered by status, agent, thread, batch, created-since."""
    check_limit(limit)
    wanted = _status(status)
    if since is not None and (isinstance(since, bool) or not isinstance(since, int | float) or math.isnan(since)):
        raise SubmitError(f"since must be a unix time in seconds (got {since!r})")
    try:
        page = rt.listings.turn_page(
            tenant,
            time.time(),
            status=wanted,
            agent=agent,
            thread=thread,
            batch=batch,
            since=since,
            cursor=cursor,
            limit=limit,
        )
    except ValueError as exc:
        raise _cursor_error(exc) from None
    raw = cast(list[str | None], _states(rt, page.ids))
    items: list[TurnItem] = []
    gone: list[str] = []
    for turn_id, found in zip(page.ids, raw, strict=True):
        if found is None:
            gone.append(turn_id)
            continue
        state = TurnState.model_validate_json(found)
        if tenant_of(state) != tenant or (wanted is not None and state.status != wanted):
            continue
        items.append(turn_item(state))
    rt.listings.drop_turns(tenant, gone)
    return Listing(items=items, next_cursor=page.next_cursor)


def _states(rt: Runtime, turn_ids: list[str]) -> list[Any]:
    """Each turn's stored state JSON in one pipelined round trip (per node on a cluster: the turns' slots vary)."""
    if not turn_ids:
        return []
    pipe = rt.redis.pipeline(transaction=False)
    for turn_id in turn_ids:
        pipe.get(rt.keys.turn(turn_id))
    return cast(list[Any], pipe.execute())


def list_approvals(
    rt: Runtime,
    tenant: str,
    *,
    pending: bool = True,
    turn: str | None = None,
    cursor: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Listing:
    """The tenant's approvals waiting for a reviewer (`pending`, newest first) or decided (latest first)."""
    check_limit(limit)
    try:
        page = rt.listings.approval_page(tenant, time.time(), pending, cursor, limit if turn is None else MAX_LIMIT)
    except ValueError as exc:
        raise _cursor_error(exc) from None
    items: list[ApprovalItem] = []
    for approval_id in page.ids:
        record = rt.approvals.get(approval_id)
        if record is None or record.tenant != tenant or (turn is not None and record.turn_id != turn):
            continue
        is_pending = record.status == "pending"
        if is_pending != pending:
            continue
        items.append(
            ApprovalItem(
                approval_id=record.approval_id,
                turn_id=record.turn_id,
                agent=record.agent,
                tenant=record.tenant,
                call_id=record.tool_call_id,
                tool=record.tool_name,
                args=record.args,
                created_at=record.created_at,
                expires_at=record.expires_at,
                state="pending" if is_pending else "decided",
                decision=None if is_pending else record.status,
                decided_by=(record.reviewer or None) if not is_pending else None,
                decided_at=(record.decided_at or None) if not is_pending else None,
            )
        )
    return Listing(items=items[:limit], next_cursor=page.next_cursor)


def list_threads(rt: Runtime, tenant: str, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT) -> Listing:
    """The tenant's threads, the most recently active first."""
    check_limit(limit)
    try:
        page = rt.listings.thread_page(tenant, time.time(), cursor, limit)
    except ValueError as exc:
        raise _cursor_error(exc) from None
    pipe = rt.redis.pipeline(transaction=False)  # one round trip (per node on a cluster) for the whole page
    for thread_id in page.ids:
        pipe.hgetall(rt.keys.thread(thread_id))
        pipe.llen(rt.keys.thread_turns(thread_id))
        pipe.lrange(rt.keys.thread_messages(thread_id), 0, TITLE_MESSAGES - 1)
    replies = pipe.execute() if page.ids else []
    items: list[ThreadItem] = []
    for index, thread_id in enumerate(page.ids):
        record, turns, messages = replies[3 * index : 3 * index + 3]
        if not record or record.get("tenant", "") != tenant:
            continue
        items.append(
            ThreadItem(
                thread_id=thread_id,
                tenant=tenant,
                agent=record["agent"],
                title=_title(json.loads(record.get("metadata") or "{}"), messages),
                last_activity=float(record["updated_at"]),
                turns=int(turns),
                status="running" if record.get("running") else "idle",
            )
        )
    return Listing(items=items, next_cursor=page.next_cursor)


def _title(metadata: dict[str, Any], messages: list[str]) -> str:
    """The thread's `metadata.title`, else the start of its first user message."""
    title = metadata.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()[:120]
    for raw in messages:
        message = json.loads(raw)
        if message.get("role") == "user":
            text = UserMessage.model_validate(message).content.strip().splitlines()
            return text[0][:80] if text else ""
    return ""
