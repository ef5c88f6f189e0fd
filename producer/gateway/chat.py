"""The AI SDK chat protocol: what `useChat` (npm `ai` / `@ai-sdk/react`, 7.x) speaks, served unchanged.

    POST /v1/chat                   DefaultChatTransport's body: {id, messages: UIMessage[], trigger, messageId}
    GET  /v1/chat/{id}/stream       resume the chat's active answer from its start (204 when none is active)
    GET  /v1/chat/{id}/messages     the chat so far as UIMessages (a page's initial `messages`)

A chat id is a thread, created on first use and scoped to the caller's tenant (clients choose chat ids,
so two tenants' equal ids are two threads); a thread id of the caller's own (`thr_…`, from GET /v1/threads)
is also a chat id, naming that thread. The agent is `?agent=` on the URL, else the body's `agent`,
else the thread's, else STEPQ_GATEWAY_CHAT_AGENT. The last message decides what a POST does:

- a user message: its text and files (file parts: `data:` URLs, or URLs on STEPQ_ATTACHMENT_URL_ALLOW,
  of the media types the agent accepts) are the thread's next turn;
- an assistant message whose tool parts carry approval responses (`addToolApprovalResponse`): each is
  decided as the caller, exactly as POST /v1/approvals/{id} does, and the answer continues in the
  same assistant message.

The answer is a UI message stream (see `ui_stream`): one assistant message per turn, id = turn id.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from stepq.errors import ThreadBusyError, ThreadNotFoundError
from stepq.models import Event, EventType
from stepq.producer.gateway import chat_tool_outputs, routes_approvals, sse
from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.routes_turns import gateway
from stepq.producer.gateway.service import Gateway
from stepq.producer.gateway.streams import RawEvent, follow_batches
from stepq.producer.gateway.ui_history import ui_messages
from stepq.producer.gateway.ui_stream import DONE, UI_STREAM_HEADERS, UIMessageTranslator, sse_frame
from stepq.turns.client_results import client_results_in
from stepq.turns.threads import Thread

router = APIRouter(prefix="/v1/chat", tags=["chat"])

MAX_CHAT_ID = 200
THREAD_ID_PREFIX = "thr_"  # a chat id that is a thread id opens that thread (the chat page's list of threads)


class ChatRequest(BaseModel):
    """DefaultChatTransport's request body. Extra fields (the app's own `body`) are allowed and ignored."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=MAX_CHAT_ID, description="the chat id: one thread per tenant")
    messages: list[dict[str, Any]] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None  # the AI SDK's field name
    agent: str | None = None
    context: dict[str, Any] | None = Field(
        default=None,
        description="the turn's runtime context for the agent's tools (useChat: `body: {context: ...}`), "
        "checked against its context_schema; the caller's data, like metadata: never an authorization fact",
    )


@dataclass(frozen=True)
class Decision:
    approval_id: str
    approved: bool
    reason: str


Agent = Annotated[str | None, Query(description="the agent answering this chat (else the body's, the thread's)")]


@router.post(
    "",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "an AI SDK UI message stream"}},
)
async def chat(
    body: ChatRequest,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("submit"))],
    agent: Agent = None,
    traceparent: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Answer the chat's last message with a UI message stream (header `x-vercel-ai-ui-message-stream: v1`);
    a W3C `traceparent` header makes the turn's spans part of the caller's trace."""
    if body.trigger == "regenerate-message":
        raise GatewayError(
            422, "unsupported-trigger", "regenerating an answer is not supported; send a new user message instead"
        )
    last = body.messages[-1]
    if last.get("role") == "user":
        return await _ask(gw, principal, body.id, agent or body.agent, last, traceparent, body.context)
    if last.get("role") == "assistant":
        return await _answer_approvals(gw, principal, body.id, last)
    raise GatewayError(422, "invalid-request", "the last message must have role 'user' or 'assistant'")


async def _ask(
    gw: Gateway,
    principal: Principal,
    chat_id: str,
    agent: str | None,
    message: dict[str, Any],
    traceparent: str | None,
    context: dict[str, Any] | None,
) -> StreamingResponse:
    """A user message: the thread's next turn, streamed from its start."""
    text, files = _user_input(message)
    thread = await _thread_for(gw, principal, chat_id, agent)
    turn_id = await _continue(gw, principal, chat_id, thread, text, files, traceparent, context)
    return _stream_response(gw, turn_id, 0, _metadata(chat_id, thread))


async def _answer_approvals(
    gw: Gateway, principal: Principal, chat_id: str, message: dict[str, Any]
) -> StreamingResponse:
    """An assistant message with approval responses or client-side tool outputs (`addToolOutput`): decide and
    supply them, then continue the same message."""
    decisions = _approval_responses(message)
    thread = await _existing_thread(gw, principal, chat_id)
    turn_id = str(message.get("id", ""))
    known = thread is not None and turn_id in {t.turn_id for t in thread.turns}
    outputs = await chat_tool_outputs.new_outputs(gw, turn_id, message) if known else None
    if not decisions and not outputs:
        raise GatewayError(
            422,
            "invalid-request",
            "the last message is an assistant message without tool approval responses or client-side tool "
            "outputs; send a user message, answer the pending approvals (addToolApprovalResponse) or supply the "
            "tool outputs (addToolOutput)",
        )
    if decisions and not principal.may("approve"):
        raise GatewayError(403, "forbidden", "this credential lacks the 'approve' scope")
    if thread is None or not known:
        raise GatewayError(404, "not-found", f"no turn {turn_id!r} in chat {chat_id!r}")
    cursor = await _park_cursor(gw, turn_id)
    for decision in decisions:
        await _decide(gw, principal, turn_id, decision)
    if outputs:
        await chat_tool_outputs.supply(gw, principal, turn_id, outputs)
    return _stream_response(gw, turn_id, cursor, _metadata(chat_id, thread))


@router.get("/{chat_id}/stream", response_class=StreamingResponse, responses={204: {"description": "none active"}})
async def resume(
    chat_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> Response:
    """The chat's active answer from its first chunk (`useChat({resume: true})`); 204 when none is active."""
    thread = await _existing_thread(gw, principal, chat_id)
    if thread is None or thread.running_turn_id is None:
        return Response(status_code=204)
    return _stream_response(gw, thread.running_turn_id, 0, _metadata(chat_id, thread))


@router.get("/{chat_id}/messages")
async def messages(
    chat_id: str,
    gw: Annotated[Gateway, Depends(gateway)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> dict[str, Any]:
    """The chat as UIMessages: finished turns from the thread's transcript, plus the active turn's question
    (its answer comes from GET /v1/chat/{id}/stream). An unknown chat is an empty one."""
    thread = await _existing_thread(gw, principal, chat_id)
    if thread is None:
        return {"id": chat_id, "messages": [], "active": False}
    running = None
    if thread.running_turn_id is not None:
        running = await gw.run_sync(gw.runtime.turns.load, thread.running_turn_id)
    return {
        "id": chat_id,
        "agent": thread.agent,
        "messages": ui_messages(thread, running),
        "active": thread.running_turn_id is not None,
    }


# ---------------------------------------------------------------------- threads


async def _existing_thread(gw: Gateway, principal: Principal, chat_id: str) -> Thread | None:
    if not 0 < len(chat_id) <= MAX_CHAT_ID:
        raise GatewayError(422, "invalid-request", f"a chat id has 1 to {MAX_CHAT_ID} characters")
    thread_id = await gw.redis.get(gw.runtime.keys.chat(principal.tenant, chat_id))
    if not isinstance(thread_id, str) or not thread_id:
        if not chat_id.startswith(THREAD_ID_PREFIX):
            return None
        thread_id = chat_id  # a thread from GET /v1/threads, opened as a chat (only the caller's own: see below)
    try:
        return await gw.run_sync(lambda: gw.client.get_thread(thread_id, tenant=principal.tenant))
    except ThreadNotFoundError:  # expired after its TTL: the chat starts over
        return None


async def _thread_for(gw: Gateway, principal: Principal, chat_id: str, agent: str | None) -> Thread:
    """The chat's thread, created on first use with the chosen agent."""
    thread = await _existing_thread(gw, principal, chat_id)
    if thread is not None:
        if agent and agent != thread.agent:
            raise GatewayError(
                409,
                "agent-mismatch",
                f"chat {chat_id!r} talks to agent {thread.agent!r}, not {agent!r}; start a new chat",
            )
        return thread
    chosen = agent or gw.settings.gateway_chat_agent
    if not chosen:
        raise GatewayError(
            422,
            "no-agent",
            "no agent named: add ?agent=<id> to the chat URL (or `agent` to the body), "
            "or set STEPQ_GATEWAY_CHAT_AGENT on the gateway",
        )
    created = await gw.run_sync(
        lambda: gw.client.create_thread(chosen, tenant=principal.tenant, metadata={"chat_id": chat_id})
    )
    key = gw.runtime.keys.chat(principal.tenant, chat_id)
    ttl = gw.settings.thread_ttl_s
    if not await gw.redis.set(key, created.thread_id, nx=True, ex=ttl):  # a concurrent first message won
        winner = await _existing_thread(gw, principal, chat_id)
        if winner is not None:
            return winner
        await gw.redis.set(key, created.thread_id, ex=ttl)
    return created


async def _continue(
    gw: Gateway,
    principal: Principal,
    chat_id: str,
    thread: Thread,
    text: str,
    files: list[dict[str, Any]],
    traceparent: str | None,
    context: dict[str, Any] | None,
) -> str:
    content = [*files, *([{"type": "text", "text": text}] if text else [])]
    ask: dict[str, Any] = {"messages": [{"role": "user", "content": content}]} if files else {"prompt": text}
    tenant, policy = principal.tenant, principal.policy
    try:
        handle = await gw.run_sync(
            lambda: gw.client.continue_thread(
                thread.thread_id, tenant=tenant, policy=policy, traceparent=traceparent, context=context, **ask
            )
        )
    except ThreadBusyError:
        raise GatewayError(
            409,
            "chat-busy",
            "this chat is still answering; wait for the answer (resume it with GET /v1/chat/{id}/stream) "
            "or answer its pending approvals first",
        ) from None
    await gw.redis.expire(gw.runtime.keys.chat(principal.tenant, chat_id), gw.settings.thread_ttl_s)  # as the thread's
    return handle.turn_id


def _metadata(chat_id: str, thread: Thread) -> dict[str, Any]:
    return {"chatId": chat_id, "threadId": thread.thread_id, "agent": thread.agent}


# ---------------------------------------------------------------------- the request's last message


def _user_input(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The user message's text, and its file parts as stepq file parts (checked when the turn is submitted:
    the agent's accepted_media_types, the size limits, the URL allowlist)."""
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise GatewayError(422, "invalid-request", "messages[-1].parts must be a list of UI message parts")
    files = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "file":
            continue
        url, media_type, name = part.get("url"), part.get("mediaType"), part.get("filename")
        if not isinstance(url, str) or not isinstance(media_type, str):
            raise GatewayError(422, "invalid-request", "a file part needs `url` and `mediaType` strings")
        file: dict[str, Any] = {"type": "file", "media_type": media_type}
        file["data" if url.startswith("data:") else "url"] = url
        if isinstance(name, str) and name:
            file["name"] = name
        files.append(file)
    text = "".join(
        p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    )
    if not text.strip() and not files:
        raise GatewayError(422, "invalid-request", "the last user message has no text part")
    return text, files


def _approval_responses(message: dict[str, Any]) -> list[Decision]:
    """The approval responses in an assistant message's tool parts (state `approval-responded`)."""
    found: list[Decision] = []
    for part in message.get("parts") or []:
        if not isinstance(part, dict) or part.get("state") != "approval-responded":
            continue
        kind = str(part.get("type", ""))
        if not (kind.startswith("tool-") or kind == "dynamic-tool"):
            continue
        approval = part.get("approval")
        if not isinstance(approval, dict) or not isinstance(approval.get("id"), str):
            raise GatewayError(422, "invalid-request", "an approval-responded tool part has no approval.id")
        if not isinstance(approval.get("approved"), bool):
            raise GatewayError(422, "invalid-request", f"approval {approval['id']}: `approved` must be true or false")
        reason = approval.get("reason")
        found.append(Decision(approval["id"], approval["approved"], reason if isinstance(reason, str) else ""))
    return found


async def _decide(gw: Gateway, principal: Principal, turn_id: str, decision: Decision) -> None:
    """The approvals route's own path (tenant check, token looked up server-side, reviewer = the caller).
    An approval already decided (a re-sent message, another reviewer) is left as it is."""
    record = await gw.run_sync(gw.runtime.approvals.get, decision.approval_id)
    if record is not None and record.turn_id != turn_id:
        raise GatewayError(422, "invalid-request", f"approval {decision.approval_id} is not one of this message's")
    if record is not None and record.status != "pending":
        return
    body = routes_approvals.DecisionBody(approved=decision.approved, reason=decision.reason[:2000])
    await routes_approvals.decide(decision.approval_id, body, gw, principal)


async def _park_cursor(gw: Gateway, turn_id: str) -> int:
    """Where a continuation starts: just after the turn's latest approval request (the client has the rest)."""
    events = await gw.reader.read(turn_id, 0)
    requests = [e.seq for e in events if e.type in _PARKING]
    return requests[-1] if requests else (events[-1].seq if events else 0)


# ---------------------------------------------------------------------- the stream


def _stream_response(gw: Gateway, turn_id: str, cursor: int, metadata: dict[str, Any]) -> StreamingResponse:
    return StreamingResponse(
        _ui_stream(gw, turn_id, cursor, metadata), media_type="text/event-stream", headers=UI_STREAM_HEADERS
    )


@dataclass(frozen=True)
class _Waiting:
    """A parked turn that waits on people: its status, and the parked step's requests to show them."""

    status: str
    step: int
    approvals: dict[str, str]  # approval id -> tool call id
    client_calls: list[str]  # tool call ids


async def _waits_on_people(gw: Gateway, turn_id: str) -> _Waiting | None:
    """The parked step when at least one of its approvals is still undecided and unexpired, or a client-side
    tool result is still to come from the browser; None otherwise."""
    state = await gw.run_sync(gw.runtime.turns.load, turn_id)
    if state is None or not state.status.parked or state.parked is None:
        return None
    parked = state.parked
    waiting = _Waiting(
        status=state.status.value,
        step=state.step,
        approvals={a.approval_id: a.tool_call_id for a in parked.approvals},
        client_calls=[c.tool_call_id for c in parked.client_calls],
    )
    if not await gw.run_sync(client_results_in, gw.runtime, state, time.time()):
        return waiting
    records = await gw.run_sync(gw.runtime.approvals.get_many, list(waiting.approvals))
    now = time.time()
    pending = any(r is not None and r.status == "pending" and now < r.expires_at for r in records.values())
    return waiting if pending else None


async def _close_parked(
    gw: Gateway, turn_id: str, translator: UIMessageTranslator, after: int, waiting: _Waiting
) -> list[dict[str, Any]]:
    """The chunks that close a parked turn's message: the logged events after `after`, then the step's
    requests. A worker publishes those just after its parking commit, so the turn can be seen parked a moment
    before they are in the log (or, if the worker died in between, never); any still missing are built from
    the stored parked step, so the client always gets something to answer."""
    chunks: list[dict[str, Any]] = []
    approvals, calls = dict(waiting.approvals), set(waiting.client_calls)
    for raw in await gw.reader.read(turn_id, 0):
        fed = raw.seq > after and not translator.finished
        if not fed and raw.type not in _PARKING:
            continue  # decoded only when fed or looked into
        event = _event(raw)
        if event.type == EventType.APPROVAL_REQUEST:
            approvals.pop(str(event.data.get("approval_id")), None)
        elif event.type == EventType.TOOL_RESULTS_REQUEST:
            calls.difference_update(str(c.get("tool_call_id")) for c in event.data.get("calls", ()))
        if fed:
            chunks += translator.feed(event)
    missing: list[tuple[EventType, dict[str, Any]]] = [
        (EventType.APPROVAL_REQUEST, {"approval_id": a, "tool_call_id": c}) for a, c in approvals.items()
    ]
    if calls:
        missing.append((EventType.TOOL_RESULTS_REQUEST, {"calls": [{"tool_call_id": c} for c in sorted(calls)]}))
    for type_, data in missing:
        event = Event(turn_id=turn_id, seq=0, type=type_, step=waiting.step, data=data, ts=time.time())
        chunks += translator.feed(event)
    return chunks + translator.end_parked(waiting.status)


async def _ui_stream(gw: Gateway, turn_id: str, cursor: int, metadata: dict[str, Any]) -> AsyncIterator[bytes]:
    """The turn's events after `cursor` as UI chunks; the message closes when the turn ends or parks.
    Events arrive in batches (a slow client gets bigger ones) and each batch goes out as one write."""
    translator = UIMessageTranslator(turn_id, metadata)
    metrics = gw.metrics
    metrics.open_streams.inc()
    try:
        yield _frames(translator.begin())
        waiting = await _waits_on_people(gw, turn_id)
        if waiting:  # parked: what there is, then the message closes
            yield _frames(await _close_parked(gw, turn_id, translator, cursor, waiting)) + DONE
            return
        seen = cursor
        async for batch in follow_batches(gw.hub, gw.reader, turn_id, cursor, gw.settings.gateway_keepalive_s):
            if not batch:  # a quiet stream: it closes if the turn now waits on people (a partial decision)
                waiting = await _waits_on_people(gw, turn_id)
                if waiting:
                    yield _frames(await _close_parked(gw, turn_id, translator, seen, waiting)) + DONE
                    return
                yield sse.KEEPALIVE
                continue
            chunks = []
            for raw in batch:
                seen = raw.seq
                chunks += translator.feed(_event(raw))
                if translator.finished:
                    break
                if raw.type in _PARKING and translator.parked:
                    waiting = await _waits_on_people(gw, turn_id)
                    if waiting:
                        chunks += translator.end_parked(waiting.status)
                        yield _frames(chunks) + DONE
                        return
            yield _frames(chunks)
            if translator.finished:
                break
        yield _frames(translator.end_unfinished()) + DONE
    finally:
        metrics.open_streams.dec()


_PARKING = (EventType.APPROVAL_REQUEST.value, EventType.TOOL_RESULTS_REQUEST.value)  # events a step parks with


def _event(raw: RawEvent) -> Event:
    return Event.model_validate_json(raw.payload)


def _frames(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(sse_frame(c) for c in chunks)
