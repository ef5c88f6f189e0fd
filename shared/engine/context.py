"""What every stage of a step shares: the delivery it runs in, the step's context, and the `Decision` it ends in.

A delivery (`Delivery`) is the lease, the turn's state and the step's event buffer: all a fenced commit
needs, so the endings (engine/finish.py) take one even before the agent is known. Once the agent is
loaded the step runs on a `StepContext`, which adds what the stages read and write along the way (the
agent as the policies leave it, the resolved policies, a checkpointed answer). One context object per
delivery replaces the long argument lists the stages would otherwise pass each other.

The commit here is the one the engine always made: compare-and-set on the turn's version, fenced on the
lease token, sent in the same round trip as the step's pending events. A commit nothing has to wait for (a
queued turn shown as running) can *ride*: it goes out with the step's next write, and the step's next
commit takes it over (`Delivery.ride`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from stepq.agents.definition import AgentDefinition
from stepq.engine.emitter import StepEmitter
from stepq.fleet.runtime import Runtime
from stepq.logging import Redactor, describe_exception, secret_values
from stepq.models import AttemptTrace, EventType, StepOutput, StepTrace, ToolResult, TurnResult, TurnState
from stepq.policy.resolution import Effective
from stepq.providers.base import StepRequest
from stepq.store.batch_runs import BatchClaim
from stepq.store.leases import StepLease
from stepq.store.quotas import Window
from stepq.store.turns import PreparedWrite


def worker_id() -> str:
    """Host and pid of the process running a step (computed per call: prefork children differ)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Decision:
    """What the task shell must do after a delivery."""

    action: Literal["none", "next", "retry", "reschedule"]
    step: int = 0
    countdown: float = 0.0
    attempt: int = 0
    reason: str = ""
    priority: str = "interactive"  # picks the queue the next message goes to
    queue: str = ""  # ...unless the turn is pinned to an older definition: its queue (see engine/upgrade.py)
    start: tuple[str, ...] = ()  # other turns whose first step to send now (a thread's next turn)
    batch: str = ""  # the driven batch of a batch turn that just ended: its driver makes a pass now
    claim: BatchClaim | None = None  # ...or the batch's next item, claimed for this worker to run


def none(reason: str) -> Decision:
    """Nothing for the task shell to send: the step ended here (committed, lost, parked or waiting)."""
    return Decision("none", reason=reason)


def maybe(turn_id: str | None) -> tuple[str, ...]:
    """`Decision.start` for at most one turn to start."""
    return (turn_id,) if turn_id else ()


def emitter_text(emitter: StepEmitter) -> str:
    """The text the step streamed so far (kept as the turn's text when it ends mid-stream)."""
    return "".join(emitter.text_parts)


class StepObserver(Protocol):
    """What watches the lifecycle points (engine/lifecycle.py): the agent's hooks, the OTel exporter. An
    exception a live point lets out fails the step; the points after a commit must not raise."""

    def step_started(self, ctx: StepContext) -> None: ...

    def model_requested(self, ctx: StepContext, request: StepRequest) -> None: ...

    def attempt_ended(self, d: Delivery, attempt: AttemptTrace) -> None: ...

    def step_finished(self, d: Delivery, trace: StepTrace, results: list[ToolResult]) -> None: ...

    def turn_finished(self, d: Delivery, result: TurnResult) -> str | None:
        """May return a follow-up prompt for the turn's thread (only the agent's hooks do)."""
        ...


@dataclass(slots=True)
class RidingCommit:
    """A commit queued on the step's emitter (`Delivery.ride`): sent with its next write, or not at all."""

    prepared: PreparedWrite
    sent: bool = False
    replied: bool = False
    reply: Any = None
    error: BaseException | None = None

    def args(self) -> list[Any]:
        """The commit's arguments, asked for by the emitter only as the commit goes out."""
        self.sent = True
        return self.prepared.args

    def answered(self, reply: Any, error: BaseException | None) -> None:
        self.replied, self.reply, self.error = True, reply, error


@dataclass(slots=True, kw_only=True)
class Delivery:
    """One delivery's lease, turn state and event buffer: what a fenced commit needs."""

    rt: Runtime
    state: TurnState
    lease: StepLease
    emitter: StepEmitter
    pending_checkpoint: PreparedWrite | None = None  # the step's checkpoint while it still rides the next write
    observers: tuple[StepObserver, ...] = ()  # who sees the lifecycle points (engine/lifecycle.py); () for most
    attempt_started_at: float | None = None  # wall clock of the model call now running (its trace's start)
    tool_timings: dict[str, tuple[float, float]] = field(default_factory=dict)  # call id -> (start, seconds)
    quota_windows: list[Window] = field(default_factory=list)  # the tenant's quotas this step counts toward
    riding: RidingCommit | None = None  # a commit queued on the emitter, until the next commit takes it over

    def ride(self) -> bool:
        """Queue a commit of the state as it is (the lease kept) to go out with the step's next write (its
        step-start and first delta), or when the flush window ends, instead of a round trip of its own that
        the model call would wait for. The next `commit` takes it over. False, and nothing queued, when it
        has to go out on its own: on a cluster (its lists are written apart), or with transcript or trace
        rows to store or a quota to count (a commit that took them must be known before anything else does)."""
        state = self.state
        if (
            self.riding is not None
            or self.rt.turns.indexes.separate
            or len(state.messages) != state._stored_messages
            or len(state.trace.steps) != state._stored_trace
            or self._quota_count()
        ):
            return False
        prepared = self.rt.turns.prepare_commit(state, lease_token=self.lease.token, release=False)
        self.riding = riding = RidingCommit(prepared)
        self.emitter.defer_write(prepared.script, prepared.keys, riding.args, riding.answered)
        for script, keys, args in prepared.riders:  # the listing: applied only if the commit took
            self.emitter.defer_write(script, keys, args)
        return True

    def drop_riding(self) -> RidingCommit | None:
        """Settle a riding commit without taking it over, and return it: dropped if still queued; if it went out,
        its reply is in (and the store holds its outcome) when this returns. A crashed step calls it before it
        reloads the turn, so no riding commit goes out behind the reload and moves the version under it."""
        riding, self.riding = self.riding, None
        if riding is not None:
            prepared = riding.prepared
            self.emitter.discard_write(prepared.script, prepared.keys)  # waits out a flush carrying it
            for script, keys, _ in prepared.riders:
                self.emitter.discard_write(script, keys)
        return riding

    def _take_over_riding(self) -> bool:
        """Before the next commit: a riding commit still queued is dropped (this commit carries its change);
        one that went out counts as it came back. False: it did not take (the lease or version moved on)."""
        riding = self.drop_riding()
        if riding is None:
            return True
        prepared = riding.prepared
        if not riding.sent:
            self.state.version = prepared.expected_version
            return True
        if riding.error is not None:
            raise riding.error
        assert riding.replied, "a riding commit that went out has its reply once its flush let go of the lock"
        return self.rt.turns.finish_riding_commit(prepared, riding.reply)

    def commit(self, release: bool = True, announce: tuple[EventType, dict[str, Any]] | None = None) -> bool:
        """A fenced commit: only while this delivery's lease is held; the step's last commit releases it.
        `announce`: an event the commit itself writes after the step's events, only if it takes."""
        if not self._take_over_riding():
            return False
        lease = self.lease
        counting = self._quota_count()
        event = None
        if announce is not None:
            event = self.emitter.log.announcement(self.state.turn_id, announce[0], self.emitter.step, announce[1])
        prepared = self.rt.turns.prepare_commit(self.state, lease_token=lease.token, release=release, announce=event)
        checkpoint, self.pending_checkpoint = self.pending_checkpoint, None
        if checkpoint is not None:  # not written yet, and moot once this commits
            self.emitter.discard_write(checkpoint.script, checkpoint.keys)
        # the step's events go out just before its commit, in the same round trip (with the listings' update
        # and its usage's quota count)
        reply, *_ = self.emitter.flush_with(
            (prepared.script, prepared.keys, prepared.args), *prepared.riders, *counting
        )
        ok = self.rt.turns.finish_commit(prepared, reply)
        if ok and release:
            lease.released = True
        return ok

    def _quota_count(self) -> list[tuple[Any, list[str], list[Any]]]:
        """The write adding this commit's new trace rows' tokens and cost to the tenant's quota counters."""
        if not self.quota_windows:
            return []
        new = self.state.trace.steps[self.state._stored_trace :]
        tokens = sum(t.usage.input_tokens + t.usage.output_tokens for t in new)
        cost = sum(t.cost or 0.0 for t in new)
        if not tokens and not cost:
            return []
        quotas = self.rt.quotas
        return [
            (quotas.script, [w.key for w in self.quota_windows], quotas.count_args(self.quota_windows, tokens, cost))
        ]

    def describe(self, exc: BaseException) -> str:
        """An unexpected exception as events and the turn's error show it: one line, bounded, secrets masked."""
        settings = self.rt.settings
        return describe_exception(exc, Redactor(secret_values(settings)), settings.tool_error_chars)

    def tenant(self) -> str:
        """The `tenant` label of token and cost metrics: the turn's metadata value under the configured key."""
        key = self.rt.settings.metrics_tenant_key
        value = self.state.metadata.get(key) if key else None
        return str(value)[:64] if value is not None else ""


@dataclass(slots=True, kw_only=True)
class StepContext(Delivery):
    """A delivery whose agent is loaded: what the stages of the step share."""

    agent: AgentDefinition  # as this step's policies leave it (tools, mutation policy), once begin resolved them
    checkpoint: StepOutput | None = None  # the model's answer to this step, stored before a crash: replayed
    effective: Effective | None = None  # this step's policies resolved (see begin.apply_policy)
    tools_refused: list[dict[str, str]] = field(default_factory=list)  # MCP tools not offered this step, and why
    policy_version: int = 0  # of the tenant policies, read with the lease: the tenant's credentials are read at it
    quota_usage: dict[str, Any] = field(default_factory=dict)  # the quota counters read with the lease
