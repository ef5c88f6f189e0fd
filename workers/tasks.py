"""Tasks: `run_step` (a loop step, then inline its turn's next ones while nothing waits), `approve`, `batch_drive`, the periodic `sweep` and `provider_batch_tick`.

The task bodies are module-level functions registered on each app (the same callables
for every app); they read their settings from the app that runs them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task
from celery.worker import state as worker_state

from stepq.batches import driver as batch_driver
from stepq.batches import provider as provider_batches
from stepq.config.settings import Settings
from stepq.engine.decisions import decide_approval, sweep
from stepq.engine.runner import Decision, StepRunner
from stepq.fleet.metrics import STEP_DELIVERIES
from stepq.fleet.protocol import (
    APPROVE,
    BATCH_DRIVE,
    PROVIDER_BATCH_TICK,
    RUN_STEP,
    SWEEP,
    queue_for,
    run_step_message,
    send_options,
)
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.logging import log_context
from stepq.store.batch_runs import BatchClaim

log = logging.getLogger("stepq.worker")

INLINE_BUDGET_S = (
    0.5  # how long one task runs steps inline (its turn's next ones, a batch's items) before it hands over
)
INLINE_CHECK_S = 0.02  # how often an inline run looks for interactive steps waiting (then it stops)


def _settings(task: Task) -> Settings:
    settings: Settings = task.app.conf.stepq_settings
    return settings


def _runtime(task: Task) -> Runtime:
    return get_runtime(_settings(task))


def _enqueue_step(
    task: Task,
    turn_id: str,
    step: int,
    priority: str,
    countdown: float | None = None,
    attempt: int | None = None,
    queue: str = "",
) -> None:
    """Send a step: to its priority's queue, or to `queue` (a turn pinned to an older agent definition)."""
    settings = _settings(task)
    options = {**send_options(settings), **run_step_message(turn_id, step, attempt)}
    task.app.send_task(RUN_STEP, countdown=countdown, queue=queue or queue_for(settings, priority), **options)
    _runtime(task).turns.mark_sent(turn_id, step)  # a crash before this line is found by the sweeper


def run_step(self: Task, turn_id: str, step: int, attempt: int = 0) -> str:
    """Run one delivery of step `step` (`attempt` is informational: the turn state holds the truth), then, with
    `STEPQ_INLINE_STEPS`, the turn's next steps here while nothing else waits for this worker."""
    with log_context(turn_id=turn_id, step=step, attempt=attempt):  # on every log line of the delivery
        first = _deliver(self, turn_id, step)
        if first.action == "retry":
            raise self.retry(
                args=[turn_id, step],
                kwargs={"attempt": first.attempt},
                countdown=first.countdown,
                queue=first.queue or queue_for(_settings(self), first.priority),
            )
    decision = first
    clock = _InlineClock()  # one budget for everything this task runs inline: steps, then batch items
    if (
        _settings(self).inline_steps
        and _continues(first)
        and _came_from(self, queue_for(_settings(self), first.priority))
    ):
        chained = _run_inline(self, turn_id, first.step, first.priority, clock)
        if chained is None:
            return "next:handed over"  # its next step went through the broker
        decision = chained
    _follow(self, turn_id, decision)
    if decision.batch:
        _drive_inline(self, decision.batch, decision.claim, clock)  # a driven batch's turn ended: its next item
    return f"{decision.action}:{decision.reason}"


def _continues(decision: Decision) -> bool:
    """Whether a delivery's decision is its turn's next step, runnable by this worker now."""
    return decision.action == "next" and not decision.start and not decision.queue  # a pinned step: its own workers


def _came_from(task: Task, queue: str) -> bool:
    """Whether this task was delivered from `queue`, the one its turn's next step would be sent to: a worker
    may run that step only if it serves that queue (a step from a pinned queue ran on an older definition's
    worker, which leaves the next one to the workers of the queue it goes to)."""
    delivery = task.request.delivery_info or {}
    return bool(delivery.get("routing_key") == queue)


@dataclass
class _InlineClock:
    """When an inline run hands over to the broker: past INLINE_BUDGET_S, when interactive steps wait in the
    broker (looked at every INLINE_CHECK_S), or when the worker is shutting down."""

    started: float = field(default_factory=time.monotonic)
    checked: float = field(default_factory=time.monotonic)

    def hand_over(self, task: Task) -> bool:
        if _shutting_down():
            return True
        now = time.monotonic()
        if now - self.started > INLINE_BUDGET_S:
            return True
        if now - self.checked > INLINE_CHECK_S:
            self.checked = now
            return _interactive_waiting(task)
        return False


def _shutting_down() -> bool:
    """Whether this worker began a warm or cold shutdown (Celery sets the flag to the exit code, 0 included;
    in a prefork child, which never sees the flag, the inline budget bounds the run instead)."""
    return any(
        flag is not None and flag is not False for flag in (worker_state.should_stop, worker_state.should_terminate)
    )


def _run_inline(task: Task, turn_id: str, step: int, priority: str, clock: _InlineClock) -> Decision | None:
    """Run the turn's steps from `step` in this task, one delivery each (each fenced, leased and committed
    on its own), until one ends on something other than its next step: that decision is returned for
    `_follow`. When the clock says so, the step is sent through the broker instead and None is returned.
    A crash here leaves the step unsent (or leased, then lapsed): the sweeper sends it, as for any worker."""
    while True:
        if clock.hand_over(task):
            _enqueue_step(task, turn_id, step, priority)
            if step == 0:
                _runtime(task).turns.mark_dispatched(turn_id)
            return None
        with log_context(turn_id=turn_id, step=step, attempt=0):
            decision = _deliver(task, turn_id, step)
        if not _continues(decision):
            return decision
        step = decision.step


def _deliver(task: Task, turn_id: str, step: int) -> Decision:
    decision = StepRunner(_runtime(task)).deliver(turn_id, step)
    STEP_DELIVERIES.labels(decision.action).inc()
    _log_decision(decision)
    return decision


def _follow(task: Task, turn_id: str, decision: Decision) -> None:
    """Send what a delivery's decision asks for: a thread's next turn, the next step, a retry, a later try."""
    for other in decision.start:  # a thread's next turn, now that this one has ended
        _enqueue_step(task, other, 0, decision.priority)
    pinned = decision.queue
    if decision.action == "next":
        _enqueue_step(task, turn_id, decision.step, decision.priority, queue=pinned)
    elif decision.action == "retry":  # run_step retries its own message; an inline step has none to retry
        _enqueue_step(task, turn_id, decision.step, decision.priority, decision.countdown, decision.attempt, pinned)
    elif decision.action == "reschedule":
        _enqueue_step(task, turn_id, decision.step, decision.priority, countdown=decision.countdown, queue=pinned)


def _drive(
    task: Task, batch_id: str, full_check: bool = False, keep_one: bool = False
) -> tuple[batch_driver.DrivePlan, tuple[str, str] | None]:
    """A driver pass; with `keep_one`, the first turn placed is not sent but returned, to run in this task."""
    kept: list[tuple[str, str]] = []

    def send(turn_id: str, priority: str) -> None:  # as each item is placed (its send recorded by mark_sent)
        if keep_one and not kept:
            kept.append((turn_id, priority))  # counts as unsent until it runs: the sweeper covers a crash
            return
        _enqueue_step(task, turn_id, 0, priority)
        _runtime(task).turns.mark_dispatched(turn_id)

    plan = batch_driver.drive(_runtime(task), batch_id, full_check=full_check, send=send)
    return plan, (kept[0] if kept else None)


def _drive_inline(task: Task, batch_id: str, claim: BatchClaim | None, clock: _InlineClock) -> None:
    """Run a driven batch's next item here, in this task, instead of through the broker (for a short item the
    hop is most of its cost): the item the ended turn's script claimed for this worker, else the first one a
    driver pass places. Again while its steps and the next items keep coming, within the task's `_InlineClock`. What
    is not run here is sent as usual: a crash here leaves a claim the tick places, or a turn the sweeper sends
    (placed but unsent) or re-runs (a step whose lease lapsed), as for any worker."""
    rt = _runtime(task)
    while True:
        kept = None
        if claim is not None and claim.news:
            _drive(task, batch_id)  # other news for the driver (e.g. room a claim could not fill): sent
        while claim is not None and kept is None:  # an item recorded at once (reused, refused): claim another
            kept = batch_driver.run_claim(rt, claim)
            claim = None if kept is not None else rt.batches.claim_next(batch_id)
        if kept is None:
            _, kept = _drive(task, batch_id, keep_one=True)
        if kept is None:
            return
        turn_id, priority = kept
        decision = _run_inline(task, turn_id, 0, priority, clock)
        if decision is None:
            return
        _follow(task, turn_id, decision)
        if not decision.batch:
            return
        batch_id, claim = decision.batch, decision.claim


def _interactive_waiting(task: Task) -> bool:
    """Whether steps wait in the interactive queue, by the broker's count; an error counts as yes."""
    queue = queue_for(_settings(task), "interactive")
    try:
        with task.app.producer_or_acquire() as producer:
            channel = producer.channel
            # kombu's Redis channel: LLEN over the queue's priority lists (its passive declare refuses an
            # empty queue, whose lists do not exist); AMQP: the declared queue's message count
            size = getattr(channel, "_size", None)
            if size is not None:
                return bool(size(queue))
            return bool(channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception:  # any doubt sends the batch item through the broker, as before
        return True


def batch_drive(self: Task, batch_id: str) -> str:
    """A driver pass for a submitted batch (sent by `stepq batch submit`); see stepq.batches.driver."""
    batch_driver.wake(_runtime(self), batch_id)
    plan, _ = _drive(self, batch_id, full_check=True)
    return "finished" if plan.finished else "busy" if plan.busy else f"sent {len(plan.send)}"


def _log_decision(decision: Decision) -> None:
    if decision.action == "retry":
        log.warning("step failed before its first chunk; retry %d in %.2fs", decision.attempt, decision.countdown)
    elif decision.action == "reschedule":
        log.info("step rescheduled in %.2fs: %s", decision.countdown, decision.reason)
    elif decision.action == "next":
        log.info("step done; next step %d", decision.step)
    else:
        log.info("step delivery ended: %s", decision.reason)


def approve(
    self: Task,
    approval_id: str,
    token: str,
    approved: bool,
    reason: str = "",
    reviewer: str = "",
    args: dict[str, Any] | None = None,
    reply_to: str | None = None,
) -> str:
    """Decide an approval once; resume the loop when the step's last approval is decided."""
    rt = _runtime(self)
    outcome = decide_approval(rt, approval_id, token, approved, reason=reason, reviewer=reviewer, args=args)
    if outcome.resume is not None:
        _enqueue_step(self, *outcome.resume)
    if reply_to:
        reply = rt.keys.approval_reply(reply_to)
        payload = {"accepted": outcome.accepted, "code": outcome.code, "message": outcome.message}
        pipe = rt.redis.pipeline()
        pipe.rpush(reply, json.dumps(payload))
        pipe.expire(reply, 300)
        pipe.execute()
    return outcome.code


def sweep_turns(self: Task) -> int:
    """Re-enqueue turns whose step died (lease expired without a commit) or whose approvals expired.

    `sweep` logs each turn it finds (at INFO, with why); a sweep that finds nothing logs nothing, and
    Celery's own lines for this task are filtered out (stepq.workers.log_filters)."""
    found = sweep(_runtime(self), _settings(self).queued_grace_s)
    for turn_id, step, priority in found:
        _enqueue_step(self, turn_id, step, priority)
    rt = _runtime(self)
    for batch_id in batch_driver.active(rt):  # the driven batches' periodic tick
        batch_driver.wake(rt, batch_id)
        _drive(self, batch_id, full_check=True)
    return len(found)


def provider_batch_tick(self: Task, force_flush: bool = False) -> str:
    """Send parked requests in provider batches, poll open ones, and send each answered step again."""
    report = provider_batches.tick(_runtime(self), force_flush=force_flush)
    for turn_id, step in report.resume:
        _enqueue_step(self, turn_id, step, "batch")
    if report.collected or report.expired:  # sent batches are logged as they go (stepq.batches.provider)
        log.info("provider batches: %d requests collected, %d past their deadline", report.collected, report.expired)
    return "busy" if report.busy else f"sent {report.sent}, collected {report.collected}, expired {report.expired}"


def register_tasks(app: Celery) -> None:
    common: dict[str, Any] = {"bind": True, "acks_late": True, "reject_on_worker_lost": True}
    app.task(name=RUN_STEP, max_retries=None, **common)(run_step)
    app.task(name=APPROVE, **common)(approve)
    app.task(name=SWEEP, ignore_result=True, **common)(sweep_turns)
    app.task(name=BATCH_DRIVE, ignore_result=True, **common)(batch_drive)
    app.task(name=PROVIDER_BATCH_TICK, ignore_result=True, **common)(provider_batch_tick)
