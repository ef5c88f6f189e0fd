"""Threads: a conversation whose transcript lives server-side, continued one turn at a time.

A thread belongs to an agent and a tenant and keeps its own TTL (`STEPQ_THREAD_TTL_S`, 30 days by
default), apart from its turns' (`STEPQ_EVENT_TTL_S`). Continuing it starts a turn whose input is the
thread's transcript followed by the new messages, so the model sees the whole conversation. When a
turn of the thread ends (completed, failed or cancelled) the worker folds what the turn added into the
thread's transcript, closing any tool call left without a result, and starts the next waiting turn.

A new message while a turn of the thread runs (double-texting) follows its `multitask` policy:
`reject` (the default) refuses it with `ThreadBusyError`; `enqueue` stores the new turn and runs it
after the current one; `interrupt` stores it first in line and cancels the current turn, which stops at
its next step boundary (or between deltas of a streaming step) and then hands over.

Everything here is library code with no Celery: the caller (`Client`) sends the steps it returns.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from stepq.errors import SubmitError, ThreadBusyError, ThreadNotFoundError, UnknownAgentError
from stepq.fleet.runtime import Runtime
from stepq.jsonsafe import caller_json_problem
from stepq.models import EventType, Message, Policy, TurnState, TurnStatus
from stepq.models import closed_transcript as well_formed  # a thread keeps every tool call answered
from stepq.store.broker_push import BrokerPush
from stepq.store.keys import home
from stepq.store.threads import StoredThread
from stepq.turns.attachments import upload
from stepq.turns.submit import new_turn_state

_MESSAGE = TypeAdapter(Message)
_HISTORY_FIELDS = {"messages": True, "trace": True}


class Multitask(StrEnum):
    """What a new message does while a turn of the thread is still running."""

    REJECT = "reject"  # refuse it (ThreadBusyError; the gateway's 409)
    ENQUEUE = "enqueue"  # run it after the running turn (and any already waiting)
    INTERRUPT = "interrupt"  # cancel the running turn, then run this one first


class ThreadTurn(BaseModel):
    turn_id: str
    status: str  # a TurnStatus value, `waiting` (queued behind the running turn) or `expired`


class Thread(BaseModel):
    """A thread as a caller sees it: its transcript and its turns, oldest first."""

    thread_id: str
    agent: str
    tenant: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    updated_at: float
    running_turn_id: str | None = None
    messages: list[Message] = Field(default_factory=list)
    turns: list[ThreadTurn] = Field(default_factory=list)


@dataclass(frozen=True)
class Continued:
    """A new turn of a thread, stored. The caller sends step 0 of every turn in `send` (the new turn, when
    it runs now) and cancels `interrupt` (the running turn, under the interrupt policy)."""

    state: TurnState
    send: tuple[str, ...] = ()
    interrupt: str | None = None

    @property
    def started(self) -> bool:
        return self.state.turn_id in self.send


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex}"


def create_thread(rt: Runtime, agent: str, *, tenant: str = "", metadata: dict[str, Any] | None = None) -> Thread:
    """Store an empty thread for `agent` (which must be loaded here); its TTL starts now."""
    if not isinstance(agent, str) or rt.agents.get(agent) is None:
        known = ", ".join(rt.agents.ids()) or "none loaded (set STEPQ_AGENT_MODULES)"
        raise UnknownAgentError(f"unknown agent {agent!r}; known agents: {known}")
    if metadata is not None and not isinstance(metadata, dict):
        raise SubmitError("metadata must be a JSON object")
    problem = caller_json_problem(metadata, "metadata")
    if problem:
        raise SubmitError(problem)
    try:
        encoded = json.loads(json.dumps(metadata or {}))
    except (TypeError, ValueError) as exc:
        raise SubmitError(f"metadata is not JSON-serializable: {exc}") from None
    thread_id = new_thread_id()
    now = time.time()
    rt.threads.create(thread_id, agent, tenant, encoded, now)
    return Thread(thread_id=thread_id, agent=agent, tenant=tenant, metadata=encoded, created_at=now, updated_at=now)


def get_thread(rt: Runtime, thread_id: str, *, tenant: str | None = None) -> Thread:
    """The thread's transcript and turns. With `tenant`, another tenant's thread is not found (no leak)."""
    stored = rt.threads.load(thread_id) if isinstance(thread_id, str) else None
    if stored is None or (tenant is not None and stored.tenant != tenant):
        raise _not_found(thread_id)
    waiting = set(stored.queue)
    turns = []
    for turn_id, raw in zip(stored.turns, rt.threads.turn_states(stored.turns), strict=True):
        status = "expired" if raw is None else json.loads(raw).get("status", "expired")
        if turn_id in waiting and status == TurnStatus.QUEUED.value:
            status = "waiting"
        turns.append(ThreadTurn(turn_id=turn_id, status=status))
    return Thread(
        thread_id=stored.thread_id,
        agent=stored.agent,
        tenant=stored.tenant,
        metadata=stored.metadata,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
        running_turn_id=stored.running,
        messages=[_MESSAGE.validate_json(m) for m in stored.messages],
        turns=turns,
    )


def continue_thread(
    rt: Runtime,
    thread_id: str,
    *,
    prompt: str | None = None,
    messages: list[Any] | None = None,
    multitask: Multitask | str = Multitask.REJECT,
    tenant: str | None = None,
    metadata: dict[str, Any] | None = None,
    features: list[str] | None = None,
    attachments: list[Any] | None = None,
    caller_policy: Policy | dict[str, Any] | None = None,
    traceparent: str | None = None,
    context: Any = None,
    first_step: Callable[[TurnState], BrokerPush | None] | None = None,
    loaded: StoredThread | None = None,
) -> Continued:
    """Store the thread's next turn (its input: the thread's transcript, then these messages).

    `first_step`: the validated turn's step-0 message for a broker that is this Redis (or None, as in
    create_turn): the thread's script pushes it if the turn starts now, and `Continued.send` is then empty.
    `loaded`: the thread as just read (`settled`), instead of reading it again.
    Raises ThreadNotFoundError (unknown, expired, or another tenant's), ThreadBusyError (a turn runs and
    `multitask` is `reject`), or a SubmitError for bad input; nothing is stored when it raises."""
    try:
        policy = Multitask(multitask)
    except ValueError:
        raise SubmitError(f"multitask must be one of reject, enqueue, interrupt; not {multitask!r}") from None
    stored = loaded or (rt.threads.load(thread_id) if isinstance(thread_id, str) else None)
    if stored is None or (tenant is not None and stored.tenant != tenant):
        raise _not_found(thread_id)
    if metadata is not None and not isinstance(metadata, dict):
        raise SubmitError("metadata must be a JSON object")
    turn_metadata = {**stored.metadata, **(metadata or {}), "thread_id": thread_id}
    if stored.tenant:
        turn_metadata["tenant"] = stored.tenant
    agent, state = new_turn_state(
        rt,
        stored.agent,
        prompt=prompt,
        messages=messages,
        metadata=turn_metadata,
        features=features,
        attachments=attachments,
        policy=caller_policy,
        home=home(thread_id),
        traceparent=traceparent,
        context=context,
    )
    ttl = rt.settings.thread_ttl_s
    upload(state._objects)
    added = rt.turns.store_thread_files(thread_id, state._files, ttl) if state._files else []
    state._files = {}
    new_messages = [_MESSAGE.dump_json(m).decode() for m in state.messages]
    state.thread_id = thread_id
    state.messages = []  # the thread's transcript goes in front of the new messages when the turn starts
    single = not rt.threads.indexes.separate  # on a cluster the tenant's listing is in another slot
    start = {"agent": agent.id, "provider": state.provider, "model": state.model, "mode": agent.execution_mode}
    push = first_step(state) if first_step is not None and single else None
    outcome, running = rt.threads.submit(
        thread_id,
        state.turn_id,
        state.model_dump_json(exclude=_HISTORY_FIELDS),
        policy.value,
        new_messages,
        time.time(),
        rt.events.announcement(state.turn_id, EventType.TURN_START, 0, {**start, "thread_id": thread_id}),
        stored.tenant,
        push=push,
        listing=rt.turns.listings.turn_write(state, 0) if single else None,  # only if the script stored the turn
    )
    if outcome in ("started", "queued") and not single:
        rt.turns.listings.list_turn(state)
    if outcome in ("missing", "busy"):
        rt.turns.drop_thread_files(thread_id, added)
    if outcome == "missing":
        raise _not_found(thread_id)
    if outcome == "busy":
        raise ThreadBusyError(
            f"thread {thread_id} is still running turn {running}; wait for it to finish, or continue with "
            "multitask='enqueue' (run after it) or 'interrupt' (cancel it and run this one)",
            running or "",
        )
    send = (state.turn_id,) if outcome == "started" and push is None else ()  # else the script pushed it
    interrupt = running if policy is Multitask.INTERRUPT and outcome == "queued" else None
    return Continued(state, send, interrupt)


def turn_finished(rt: Runtime, state: TurnState) -> str | None:
    """The finish hook of a thread's turn: fold its transcript into the thread (well-formed) and return
    the next waiting turn to start, if any. Safe to run again for the same finish."""
    if state.thread_id is None:
        return None
    messages = [_MESSAGE.dump_json(m).decode() for m in well_formed(state.messages)]
    rt.turns.renew_thread_files(state.thread_id, rt.settings.thread_ttl_s)
    tenant = state.metadata.get("tenant")
    return rt.threads.finish(
        state.thread_id, state.turn_id, messages, time.time(), tenant if isinstance(tenant, str) else ""
    )


def settled(rt: Runtime, thread_id: str) -> tuple[StoredThread | None, str | None]:
    """The thread as stored once `settle` ran, and the waiting turn that started (to send): one read when no
    turn of the thread runs (a chat's next message after its answer), for `continue_thread(loaded=...)`."""
    stored = rt.threads.load(thread_id) if isinstance(thread_id, str) else None
    if stored is None or stored.running is None:
        return stored, None
    started = settle(rt, thread_id, stored.running)
    return rt.threads.load(thread_id), started


def settle(rt: Runtime, thread_id: str, running: str | None = None) -> str | None:
    """Run the finish hook of the thread's running turn if that turn has ended (or expired) and the hook has
    not run: its worker is not there yet, or died right after committing the end. Returns the waiting turn
    this started, to send. Call it before `continue_thread`, so a caller that saw a turn end never finds the
    thread busy with it. `running`: the running turn as just read (else read here)."""
    if running is None:
        running = rt.threads.running(thread_id) if isinstance(thread_id, str) else None
    if running is None:
        return None
    state = rt.turns.load(running)
    if state is not None and not state.status.terminal:
        return None
    messages = [] if state is None else [_MESSAGE.dump_json(m).decode() for m in well_formed(state.messages)]
    tenant = state.metadata.get("tenant") if state is not None else None
    return rt.threads.finish(thread_id, running, messages, time.time(), tenant if isinstance(tenant, str) else "")


def _not_found(thread_id: object) -> ThreadNotFoundError:
    return ThreadNotFoundError(f"no thread {thread_id!r} (unknown, expired after its TTL, or not yours)")
