"""The producer API: submit turns, follow their events, wait for results, approve, cancel.

The producer never imports worker code: it validates and stores a turn through the
library, then sends `run_step` by name through its own Celery app. In embedded mode
(STEPQ_REDIS_URL unset) nothing outside this process can run a turn, so the first
message a `Client` sends starts an in-process worker through `stepq.embedded`.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis
from celery import Celery
from kombu.exceptions import OperationalError as BrokerConnectionError

from stepq import embedded
from stepq.batches.items import batch_item, check_batch_id, derive_batch_id, item_idempotency_key
from stepq.config.settings import Settings, get_settings
from stepq.errors import (
    ApprovalError,
    BrokerUnavailableError,
    NoWorkerError,
    StoreUnavailableError,
    SubmitError,
    TurnNotFoundError,
    WaitTimeoutError,
)
from stepq.fleet import broker_capture, broker_clients
from stepq.fleet.protocol import (
    APPROVE,
    RUN_STEP,
    broker_is_store,
    celery_config,
    queue_for,
    run_step_message,
    send_options,
)
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.logging import redact_url
from stepq.models import Event, Policy, TurnResult, TurnState
from stepq.store.broker_push import BrokerPush
from stepq.store.connection import ever_reached
from stepq.turns import client_results as client_tools
from stepq.turns import listings, threads, trace_context
from stepq.turns.attachments import Attachment
from stepq.turns.fork import fork_turn
from stepq.turns.submit import LoopOverrides, create_turn

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class ApprovalReceipt:
    """An approval decision on its way to a worker; `wait()` tells whether it was accepted."""

    client: Client
    approval_id: str
    request_id: str
    refused: ApprovalError | None = None  # known before sending (an unknown id): nothing went to a worker

    def wait(self, timeout: float | None = 30.0) -> bool:
        """True when the worker accepted the decision; ApprovalError (its `code` an ApprovalRefusal) when it
        refused it.

        timeout: seconds to wait for the worker's answer (None: no limit); WaitTimeoutError when none came (no
            worker running, or the `approve` task still queued).
        """
        limit = check_timeout("timeout", timeout)
        if self.refused is not None:
            raise self.refused
        rt = self.client.runtime
        deadline = math.inf if limit is None else time.monotonic() + limit
        # blocking slices shorter than the socket timeout, so a long wait is never taken for a dead connection
        slice_s = max(0.1, rt.settings.redis_socket_timeout_s / 2)
        popped = None
        with store_outage(rt.settings):
            while popped is None and (left := deadline - time.monotonic()) > 0:
                popped = rt.redis.blpop([rt.keys.approval_reply(self.request_id)], timeout=round(min(left, slice_s), 3))
        if popped is None:
            raise WaitTimeoutError(f"no worker answered approval {self.approval_id} within {timeout}s")
        reply = json.loads(popped[1])
        if not reply["accepted"]:
            raise ApprovalError(reply["code"], reply["message"])
        return True


@dataclass(frozen=True)
class TurnHandle:
    """A submitted turn: `Client.events` / `wait` / `get` / `cancel` bound to its id.

    `created` is False when `submit` found the turn already there (the same idempotency key).
    """

    client: Client
    turn_id: str
    created: bool = True

    def events(self, after: int = 0, idle_timeout: float | None = None) -> Iterator[Event]:
        """The turn's events after seq `after`, live until it finishes (see `Client.events`)."""
        return self.client.events(self.turn_id, after=after, idle_timeout=idle_timeout)

    def wait(self, timeout: float | None = None) -> TurnResult:
        """Block until the turn ends and return its result (see `Client.wait`)."""
        return self.client.wait(self.turn_id, timeout=timeout)

    def get(self) -> TurnState:
        """The turn's stored state now (see `Client.get`)."""
        return self.client.get(self.turn_id)

    def cancel(self) -> None:
        """Stop the turn (see `Client.cancel`)."""
        self.client.cancel(self.turn_id)


def check_timeout(name: str, value: float | None) -> float | None:
    """A wait's limit as the standard library's queues take one: None (no limit) or a number >= 0. A NaN
    (never reached, so the wait hung and then blamed Redis) or a negative one raises ValueError at the call."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be None or a number of seconds >= 0, not {value!r}")
    return value


@contextmanager
def store_outage(settings: Settings) -> Iterator[None]:
    """Redis calls already retry through an outage (STEPQ_REDIS_OUTAGE_S); one that still fails raises
    our own StoreUnavailableError instead of redis-py's error, and a broker that refuses the send raises
    BrokerUnavailableError instead of kombu's, so a caller needs only `except StepqError`."""
    try:
        yield
    except redis.RedisError as exc:
        raise unavailable(settings, exc) from exc
    except BrokerConnectionError as exc:  # kombu's, from send_task: the broker refused the connection
        where = redact_url(settings.effective_broker_url)
        raise BrokerUnavailableError(
            f"cannot reach the broker at {where} ({type(exc).__name__}: {' '.join(str(exc).split())}); is it "
            "running, and is STEPQ_BROKER_URL right? What was stored is kept: a queued turn is sent by the "
            "workers' sweeper once the broker is back"
        ) from exc


def unavailable(settings: Settings, exc: redis.RedisError) -> StoreUnavailableError:
    """One line for a Redis that failed a call: never reached (a wrong URL, a server not up), out for the
    whole outage window, or refusing the command (out of memory, a read-only replica)."""
    where = redact_url(settings.redis_url or "")
    cause = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if not ever_reached(settings):
        return StoreUnavailableError(
            f"cannot reach Redis at {where} ({cause}); is it running, and is STEPQ_REDIS_URL right?"
        )
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return StoreUnavailableError(
            f"Redis ({where}) did not answer for {settings.redis_outage_s:.0f} s "
            f"(STEPQ_REDIS_OUTAGE_S): {cause}; check that Redis is up, then retry"
        )
    return StoreUnavailableError(f"Redis ({where}) refused the call: {cause}")


def _store_errors(method: Callable[Concatenate[Client, P], R]) -> Callable[Concatenate[Client, P], R]:
    """A public Client method raises StepqError subclasses only: Redis failures become StoreUnavailableError."""

    @functools.wraps(method)
    def wrapped(self: Client, *args: P.args, **kwargs: P.kwargs) -> R:
        with store_outage(self.settings):
            return method(self, *args, **kwargs)

    return wrapped


def _outage_checked(events: Iterator[Event], settings: Settings) -> Iterator[Event]:
    with store_outage(settings):
        yield from events


class Client:
    """Submit turns and follow them; one per process is enough (it is thread-safe and holds no turn state).

    `settings` default to the `STEPQ_*` environment. Without STEPQ_REDIS_URL the client is
    *embedded*: it loads the bundled demo agents (plus STEPQ_AGENT_MODULES) and starts an
    in-process worker on its first submit, stopped by `close()`, at the end of a `with Client()`
    block, or at interpreter exit. With STEPQ_REDIS_URL, `stepq worker` processes run the turns.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or get_settings()
        self.settings = embedded.with_demo_agents(settings) if settings.embedded else settings
        with store_outage(self.settings):  # a cluster client connects as it is built
            self.runtime: Runtime = get_runtime(self.settings)
        self._celery: Celery | None = None
        # the create script pushes a new turn's first message itself: one round trip, no turn without its message
        self._push_with_turn = broker_is_store(self.settings) and broker_capture.install()
        self._sent_once = False  # a send went through: kombu's channel is open, so a captured send needs no I/O
        self._worker_lock = threading.Lock()
        self._holds_worker = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Embedded mode: stop the in-process worker this client started (once no one else uses it).
        Turns still running stop with it; with real Redis, close does nothing a worker would notice."""
        with self._worker_lock:
            if self._holds_worker:
                self._holds_worker = False
                embedded.release(self.settings)

    @property
    def celery(self) -> Celery:
        if self._celery is None:
            broker_clients.install()  # one Redis client per broker channel, not one per send
            app = Celery("stepq-producer")
            app.conf.update(celery_config(self.settings))
            self._celery = app
        return self._celery

    def _ensure_worker(self) -> None:
        """Embedded mode: a message sent now needs a worker in this process to receive it."""
        if not self.settings.embedded:
            return
        with self._worker_lock:
            if not self._holds_worker:
                embedded.acquire(self.settings)
                self._holds_worker = True

    def _send_step(self, turn_id: str, step: int, priority: str, **options: Any) -> None:
        """Send a run_step message (`options`: more of send_task's, e.g. `retry`)."""
        self._ensure_worker()
        options.update(send_options(self.settings), **run_step_message(turn_id, step))
        self.celery.send_task(RUN_STEP, queue=queue_for(self.settings, priority), **options)
        self._sent_once = True

    def _first_step(self, pushes: list[BrokerPush], state: TurnState) -> BrokerPush | None:
        """Step 0's message as Celery would send it, taken instead of sent, for the create script to push (and
        noted in `pushes`). None before this client's first send (which opens kombu's channel, connecting and
        retrying through an outage), whenever a channel cannot open and for a send kombu did not hand over: then
        the caller stores the turn and sends it as on any broker (a Redis that is down raises the store's error,
        within the store's window)."""
        if not self._sent_once:
            return None
        try:
            with broker_capture.captured() as taken:
                self._send_step(state.turn_id, 0, state.priority, retry=False)  # nothing goes out to retry
        except (BrokerConnectionError, broker_capture.NotCaptured):
            return None
        if len(taken) != 1:  # none: kombu sent it itself, before the turn exists; the send after the store is the one
            return None
        pushes.append(taken[0])
        return taken[0]

    def _check_served(self, turn_id: str, unserved_since: list[float]) -> None:
        """Embedded mode: raise NoWorkerError once no worker has existed here for NO_WORKER_AFTER_S.

        Only a worker in this process can run an embedded turn, so waiting longer would hang forever.
        `unserved_since` holds the first moment no worker was seen (empty while one runs).
        """
        if not self.settings.embedded or embedded.worker_running(self.settings):
            unserved_since.clear()
            return
        now = time.monotonic()
        if not unserved_since:
            unserved_since.append(now)
        elif now - unserved_since[0] >= embedded.NO_WORKER_AFTER_S:
            raise NoWorkerError(
                f"no worker has picked up turn {turn_id} after {embedded.NO_WORKER_AFTER_S:.0f} s: in embedded mode "
                "(STEPQ_REDIS_URL unset) only a worker inside this process runs turns, and none is running (was "
                "the Client that submitted it closed?); submit with an open Client, or set STEPQ_REDIS_URL and "
                "start `stepq worker`"
            )

    # ------------------------------------------------------------------ turns

    @_store_errors
    def submit(
        self,
        agent: str,
        *,
        prompt: str | None = None,
        messages: list[Any] | None = None,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        features: list[str] | None = None,
        provider: str | None = None,
        model: str | None = None,
        loop: LoopOverrides | dict[str, Any] | None = None,
        priority: str | None = None,
        attachments: list[Attachment] | None = None,
        provider_batch: bool = False,
        policy: Policy | dict[str, Any] | None = None,
        traceparent: str | None = None,
        context: Any = None,
        defer_tools: bool = False,
    ) -> TurnHandle:
        """Validate, store and enqueue a turn; returns its handle at once (the turn runs on a worker).

        agent: an agent id (`<module>.<name>`) from a loaded agent module.
        prompt: the user's message. Give exactly one of `prompt` and `messages`.
        messages: the conversation so far as message dicts (`{"role": "user", "content": ...}`, assistant
            and tool messages as in `TurnState.messages`); system messages come from the agent only.
        idempotency_key: the same key returns the same turn instead of a new one (and sends it if the
            first submit died before sending it); `TurnHandle.created` tells which.
        metadata: JSON-able data carried with the turn; tools read it as `ToolContext.metadata`.
        features: the caller's features, checked against the agent's `required_features`.
        provider, model: choose per turn, unless the agent or a policy sets `allow_runtime_override` false.
        loop: `LoopOverrides` (or a dict of it) that tighten the agent's loop, under the same switch; asking
            wider than the agent or a policy allows is refused, naming the layer that binds.
        policy: the caller's `Policy` (limits, tool and model allowlists, mutation downgrade), applied on
            every step below the request and above the tenant's policy; it only tightens (see stepq.policy.resolution).
        priority: `interactive` or `batch` (default: the agent's `priority`).
        provider_batch: with `priority="batch"`, send each step's model request through the provider's
            batch API (about half price, answered within hours; no worker waits). See docs/operate/batches.md.
        attachments: `Attachment`s (images, PDFs, text files) added to the last user message; the agent's
            `accepted_media_types` and STEPQ_ATTACHMENT_* limits apply. File parts in `messages` work too.
        traceparent: the W3C trace context the turn's spans join (default: the caller's current
            OpenTelemetry span, when there is one); see docs/operate/tracing.md.
        context: the runtime context the agent's tools read (`ctx.context`): a dict or an instance of the
            agent's `context_schema`, validated against it (ContextError naming the field); stored with the turn.
        defer_tools: park every tool call for you, whatever the tool declares (`tool-results-request`, then
            `resume` with the results); a call needing approval reaches you only once approved.

        Raises SubmitError (UnknownAgentError, MissingFeaturesError, OverrideError, …) naming the
        problem; nothing is stored then.
        """
        pushes: list[BrokerPush] = []  # the first step's message, when the create script pushed it
        state, created = create_turn(
            self.runtime,
            agent,
            prompt=prompt,
            messages=messages,
            idempotency_key=idempotency_key,
            metadata=metadata,
            features=features,
            provider=provider,
            model=model,
            loop=loop,
            priority=priority,
            attachments=attachments,
            provider_batch=provider_batch,
            policy=policy,
            traceparent=traceparent or trace_context.current(),
            context=context,
            defer_tools=defer_tools,
            first_step=functools.partial(self._first_step, pushes) if self._push_with_turn else None,
        )
        pushed = created and bool(pushes)  # by the create script, which also marked a keyed turn dispatched
        if not pushed and (
            created
            or (
                idempotency_key is not None
                and not state.status.terminal
                and self.runtime.turns.never_dispatched(state.turn_id)
            )
        ):  # a submitter that died between storing the turn and sending it: this retry sends it
            self._send_step(state.turn_id, 0, state.priority)
            if idempotency_key is not None:  # only a keyed turn can be submitted again
                self.runtime.turns.mark_dispatched(state.turn_id)
        return TurnHandle(self, state.turn_id, created)

    @_store_errors
    def submit_batch(
        self, agent: str, items: list[dict[str, Any]], key: str | None = None
    ) -> tuple[str, list[TurnHandle]]:
        """Submit every item as a batch-priority turn keyed by (batch, item key); returns (batch id, handles).

        agent: the agent id every item runs through.
        items: `{"key": ..., "prompt" | "messages" | "input": ..., "metadata": {...}}` dicts; `key` names
            the item within the batch.
        key: the batch id; default: derived from the agent and the item keys.

        Items are `{"key": ..., "prompt"|"messages"|"input": ...}`. Submitting the same batch again
        returns the existing turns instead of creating (and paying for) new ones. A malformed item or batch
        id raises SubmitError naming it (`items[2]: key: Field required`) before anything is stored.
        """
        try:
            parsed = [batch_item(item, f"items[{i}]") for i, item in enumerate(items)]
            batch_id = check_batch_id(key) if key else derive_batch_id(agent, json.dumps([i.key for i in parsed]))
        except ValueError as exc:  # nothing is stored yet
            raise SubmitError(str(exc)) from None
        record = self.runtime.keys.batch(batch_id)
        self.runtime.redis.hset(record, mapping={"agent": agent, "total": len(parsed)})
        handles = []
        for item in parsed:
            handle = self.submit(
                agent,
                prompt=item.prompt_text(),
                messages=item.messages,
                idempotency_key=item_idempotency_key(batch_id, item),
                metadata={**item.metadata, "batch_id": batch_id, "item_key": item.key},
                priority="batch",
            )
            handles.append(handle)
        self.runtime.redis.expire(record, self.settings.event_ttl_s)
        return batch_id, handles

    @_store_errors
    def get(self, turn_id: str) -> TurnState:
        state = self.runtime.turns.load(turn_id)
        if state is None:
            raise TurnNotFoundError(f"no turn {turn_id!r} (unknown, or expired after its TTL)")
        return state

    @_store_errors
    def events(self, turn_id: str, after: int = 0, idle_timeout: float | None = None) -> Iterator[Event]:
        """Every event after seq `after`, once each, in order: the stored log, then live until the turn finishes.

        turn_id: the turn to follow.
        after: the last seq already seen (0: from the start); reconnect with the last `event.seq`.
        idle_timeout: seconds without a new event before WaitTimeoutError, 0 or more; None waits as long as the
            turn runs. A NaN or negative one raises ValueError.

        Raises TurnNotFoundError for an unknown turn, EventCursorError for a bad `after`, and in embedded
        mode NoWorkerError when no worker in this process can run the turn. Event fields: docs/reference/events.md.
        """
        check_timeout("idle_timeout", idle_timeout)
        self.get(turn_id)

        unserved_since: list[float] = []

        def finished() -> bool:  # asked on every quiet second of the follow
            state = self.runtime.turns.load(turn_id)
            if state is None or state.status.terminal:
                return True
            self._check_served(turn_id, unserved_since)
            return False

        followed = self.runtime.events.follow(turn_id, after=after, idle_timeout=idle_timeout, is_finished=finished)
        return _outage_checked(followed, self.settings)  # the follow runs after this method has returned

    @_store_errors
    def wait(self, turn_id: str, timeout: float | None = None) -> TurnResult:
        """Block until the turn ends and return its result (text or object, finish reason, usage, trace).

        turn_id: the turn to wait for.
        timeout: seconds to wait at most, 0 or more (WaitTimeoutError after it); None waits as long as the turn
            runs. A NaN or negative one raises ValueError.
            A parked turn waits for its approvals: decide them from another thread or process.

        Raises TurnNotFoundError for an unknown turn, and in embedded mode NoWorkerError when no worker
        in this process can run the turn.
        """
        return self._wait(turn_id, check_timeout("timeout", timeout))

    def _wait(self, turn_id: str, timeout: float | None) -> TurnResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = self.runtime.redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.runtime.keys.finished(turn_id))  # told once, as turn-finish is written: not per event
        unserved_since: list[float] = []
        try:
            state = self.get(turn_id)
            while True:
                if state.status.terminal:
                    return state.result()
                self._check_served(turn_id, unserved_since)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise WaitTimeoutError(f"turn {turn_id} still {state.status.value} after {timeout}s")
                # look again once the subscription is confirmed (an end told before it took was missed), when
                # told it ended, and after a quiet second (its writer may have died after the commit)
                pubsub.get_message(timeout=min(remaining if remaining is not None else 1.0, 1.0))
                state = self.get(turn_id)
        finally:
            pubsub.close()

    @_store_errors
    def cancel(self, turn_id: str) -> None:
        """Stop the turn: a running step stops between deltas; a queued or parked turn ends at once.

        turn_id: the turn; cancelling a finished turn does nothing. The turn ends `cancelled` (its
            `turn-finish` event says so); `wait` returns that result.
        """
        state = self.get(turn_id)
        if state.status.terminal:
            return
        self.runtime.turns.request_cancel(turn_id)
        self._send_step(turn_id, state.step, state.priority)

    @_store_errors
    def resume(
        self,
        turn_id: str,
        results: Mapping[str, Any],
        *,
        errors: Collection[str] = (),
        tenant: str | None = None,
    ) -> TurnHandle:
        """Answer a turn's client-side tool calls and let its loop go on (status `awaiting_tool_results`; the
        `tool-results-request` event and `TurnState.parked.client_calls` list the open calls).

        results: one entry per open call, `{tool_call_id: output}`; the output is what the tool would have
            returned (any JSON value), and the model reads it as that call's result.
        errors: call ids whose output is an error message rather than a result.
        tenant: when given, another tenant's turn is not found.

        Every open call is answered at once, and each only once: a result for a call the turn does not wait
        for, for one already answered (a concurrent resume won), a call left out, or a turn that no longer
        waits raises ToolResultsError (its `code` a ToolResultsRefusal, `call_ids` the calls) before the
        model is asked, storing nothing. Returns the turn's handle.
        """
        state = client_tools.submit_results(self.runtime, turn_id, results, errors, tenant=tenant)
        self._send_step(turn_id, state.step, state.priority)  # still waiting for approvals: the step parks again
        return TurnHandle(self, turn_id)

    # ------------------------------------------------------------------ threads

    @_store_errors
    def create_thread(self, agent: str, *, metadata: dict[str, Any] | None = None, tenant: str = "") -> threads.Thread:
        """Start a conversation with `agent`; its transcript stays server-side for STEPQ_THREAD_TTL_S."""
        return threads.create_thread(self.runtime, agent, tenant=tenant, metadata=metadata)

    @_store_errors
    def get_thread(self, thread_id: str, *, tenant: str | None = None) -> threads.Thread:
        """The thread's transcript and turns (ThreadNotFoundError when unknown, expired or, given `tenant`,
        another tenant's). It reflects a turn that ended even if its worker has not folded it in yet."""
        self._settle_thread(thread_id)
        return threads.get_thread(self.runtime, thread_id, tenant=tenant)

    def _settle_thread(self, thread_id: str) -> None:
        """Run the finish hook of the thread's turn that ended before its worker ran it (idempotent), and send
        the waiting turn that this starts: a caller that saw a turn end sees the thread past it."""
        started = threads.settle(self.runtime, thread_id)
        if started is not None:
            self._send_step(started, 0, self.get(started).priority)

    @_store_errors
    def continue_thread(
        self,
        thread_id: str,
        *,
        prompt: str | None = None,
        messages: list[Any] | None = None,
        multitask: threads.Multitask | str = threads.Multitask.REJECT,
        tenant: str | None = None,
        metadata: dict[str, Any] | None = None,
        features: list[str] | None = None,
        attachments: list[Attachment] | None = None,
        policy: Policy | dict[str, Any] | None = None,
        traceparent: str | None = None,
        context: Any = None,
    ) -> TurnHandle:
        """The thread's next turn: the model sees the thread's transcript, then these messages. While a turn
        of the thread runs, `multitask` says what happens: `reject` (ThreadBusyError), `enqueue` (run after
        it) or `interrupt` (cancel it at its next step boundary, then run this one). `attachments` are kept
        with the thread, so later turns still see them. `policy` is the caller layer of the new turn and `context` its runtime
        context (validated against the agent's `context_schema`; each turn of a thread carries its own), as
        for submit."""
        loaded, started = threads.settled(self.runtime, thread_id)  # as _settle_thread, reading the thread once
        if started is not None:
            self._send_step(started, 0, self.get(started).priority)
        pushes: list[BrokerPush] = []  # the first step's message, when the thread's script pushed it
        continued = threads.continue_thread(
            self.runtime,
            thread_id,
            prompt=prompt,
            messages=messages,
            multitask=multitask,
            tenant=tenant,
            metadata=metadata,
            features=features,
            attachments=attachments,
            caller_policy=policy,
            traceparent=traceparent or trace_context.current(),
            context=context,
            first_step=functools.partial(self._first_step, pushes) if self._push_with_turn else None,
            loaded=loaded,
        )
        for turn_id in continued.send:
            self._send_step(turn_id, 0, continued.state.priority)
        if continued.interrupt is not None:
            self.cancel(continued.interrupt)
        return TurnHandle(self, continued.state.turn_id)

    @_store_errors
    def fork(
        self,
        turn_id: str,
        *,
        from_step: int,
        prompt: str | None = None,
        overrides: LoopOverrides | dict[str, Any] | None = None,
        model: str | None = None,
        tenant: str | None = None,
        policy: Policy | dict[str, Any] | None = None,
    ) -> TurnHandle:
        """Start a new turn from step `from_step` of `turn_id`: its transcript is the original's up to that
        step (the tool results recorded then are reused, never run again), optionally with `prompt` as the
        last user message, `overrides` tightening the loop (as `submit(loop=...)`) and another `model`. The
        new turn's `metadata.origin` is `{turn_id, step}`. With `tenant`, another tenant's turn is not found.
        Raises TurnNotFoundError or SubmitError (nothing stored then)."""
        state = fork_turn(
            self.runtime,
            turn_id,
            from_step=from_step,
            prompt=prompt,
            overrides=overrides,
            model=model,
            tenant=tenant,
            policy=policy,
        )
        self._send_step(state.turn_id, 0, state.priority)
        return TurnHandle(self, state.turn_id, True)

    # ------------------------------------------------------------------ listings

    @_store_errors
    def list_turns(
        self,
        *,
        tenant: str = "",
        status: str | None = None,
        agent: str | None = None,
        thread: str | None = None,
        batch: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = listings.DEFAULT_LIMIT,
    ) -> listings.Listing:
        """The tenant's turns, newest first: filter by status, agent, thread, batch, or created since (unix
        seconds). A page has at most `limit` items (1 to 200); `next_cursor` gets the next. `tenant` is the
        turns' `metadata.tenant` ('' for turns submitted without one). Bad input raises SubmitError."""
        return listings.list_turns(
            self.runtime,
            tenant,
            status=status,
            agent=agent,
            thread=thread,
            batch=batch,
            since=since,
            cursor=cursor,
            limit=limit,
        )

    @_store_errors
    def pending_approvals(
        self,
        *,
        tenant: str = "",
        turn: str | None = None,
        cursor: str | None = None,
        limit: int = listings.DEFAULT_LIMIT,
    ) -> listings.Listing:
        """The tenant's approvals waiting for a reviewer, newest first: tool, arguments as the reviewer sees
        them, turn, creation and expiry (never the token)."""
        return listings.list_approvals(self.runtime, tenant, pending=True, turn=turn, cursor=cursor, limit=limit)

    @_store_errors
    def decided_approvals(
        self,
        *,
        tenant: str = "",
        turn: str | None = None,
        cursor: str | None = None,
        limit: int = listings.DEFAULT_LIMIT,
    ) -> listings.Listing:
        """The tenant's decided approvals (approved, denied, expired, cancelled), latest decision first."""
        return listings.list_approvals(self.runtime, tenant, pending=False, turn=turn, cursor=cursor, limit=limit)

    @_store_errors
    def list_threads(
        self, *, tenant: str = "", cursor: str | None = None, limit: int = listings.DEFAULT_LIMIT
    ) -> listings.Listing:
        """The tenant's threads, most recently active first (title, agent, turns, running or idle)."""
        return listings.list_threads(self.runtime, tenant, cursor=cursor, limit=limit)

    # ------------------------------------------------------------------ approvals

    @_store_errors
    def approve(
        self,
        approval_id: str,
        approved: bool,
        *,
        reason: str = "",
        reviewer: str = "",
        args: dict[str, Any] | None = None,
        token: str | None = None,
    ) -> ApprovalReceipt:
        """Send a decision to the `approve` task; the worker verifies the token and decides once.

        approval_id: from the `approval-request` event (or `stepq show TURN`).
        approved: True runs the tool; False denies it (the model reads `denied by reviewer: <reason>`). Anything
            else raises TypeError (`"no"` is truthy: it must not approve).
        reason: why, shown to the model on a denial and recorded with the decision.
        reviewer: who decided, recorded with the decision and in the `approval-decision` event.
        args: the arguments you approve. Other than the requested ones, they are an edit: a tool declared
            `editable=True` runs with them once validated against its schema (`invalid-args` otherwise) and
            bound to the approval by a new signature the worker checks before running it; any other tool
            refuses the decision (`changed-args`), so a reviewer never approves arguments they did not see.
        token: the signed token stays server-side (approval-request events do not carry it) and is
            read from the pending approval's record; pass one only to present a token you hold yourself.

        Returns an ApprovalReceipt: `receipt.wait()` tells whether the worker accepted the decision. An id with
        no approval record (and no `token` given) is refused at once (`unknown`): nothing is sent.
        """
        if not isinstance(approved, bool):  # bool("no") is True: a string from a form must not approve
            raise TypeError(f"approved must be True or False, not {approved!r}")
        if token is None:
            record = self.runtime.approvals.get(approval_id) if isinstance(approval_id, str) and approval_id else None
            if record is None:  # the worker could only answer `unknown`: refused now, not after a worker's hop
                return ApprovalReceipt(self, approval_id, "", ApprovalError.unknown(approval_id))
            token = record.token
        request_id = uuid.uuid4().hex
        self._ensure_worker()
        self.celery.send_task(
            APPROVE,
            kwargs={
                "approval_id": approval_id,
                "token": token,
                "approved": approved,
                "reason": reason,
                "reviewer": reviewer,
                "args": args,
                "reply_to": request_id,
            },
            queue=self.settings.queue,
        )
        return ApprovalReceipt(self, approval_id, request_id)
