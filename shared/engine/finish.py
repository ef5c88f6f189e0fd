"""How a step ends the turn or hands on to the next step: each ending is one fenced commit.

`finish` is the one way a turn ends (completed, failed, cancelled): the step's failed attempts still get
their trace, a parked step's approvals are cancelled, the commit goes out with the step's events, and
only then do the hooks that act on a finished turn run (a thread's next turn, a batch's count and next
item), so a crash between the two runs them again on the redelivery (both are idempotent).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from stepq.batches.items import result_line
from stepq.engine import batch_step, lifecycle, stopping, tracing
from stepq.engine.context import Decision, Delivery, StepContext, maybe, none
from stepq.engine.pricing import add_costs
from stepq.errors import StepqError
from stepq.fleet.metrics import TURNS, untrack_pending
from stepq.models import EventType, FinishReason, LoopStop, StepLoss, StepTrace, TurnStatus
from stepq.store.batch_runs import TurnEnd
from stepq.store.listings import tenant_of
from stepq.turns import threads

log = logging.getLogger("stepq.engine")


def advance(d: Delivery) -> Decision:
    """The step is done and the turn goes on: commit it and send the next step."""
    state = d.state
    state.step += 1
    state.parked = None
    state.status = TurnStatus.RUNNING
    if not d.commit():
        return none(StepLoss.COMMIT_LOST)
    if d.observers:  # the hooks and spans of the step just committed
        lifecycle.step_committed(d, state.step - 1)
    return Decision("next", step=state.step)


def fail(d: Delivery, message: str) -> Decision:
    """The turn fails with a message that says what went wrong."""
    d.state.error = message
    d.emitter.publish(EventType.ERROR, {"message": message})
    return finish(d, TurnStatus.FAILED, FinishReason.ERROR)


def finish_limit(ctx: StepContext, stop: LoopStop) -> Decision:
    """A loop limit ends the turn: completed, unless object mode has no valid object yet."""
    state = ctx.state
    state.stopped_by = stop
    stopping.mark(state, stop)
    if ctx.agent.execution_mode == "object" and state.object is None:
        return fail(ctx, f"no valid object before the loop stopped ({stop.value})")
    return finish(ctx, TurnStatus.COMPLETED, stop.finish_reason)


def finish(d: Delivery, status: TurnStatus, reason: FinishReason) -> Decision:
    """End the turn: commit its end, then start what waits on it and announce `turn-finish` — in the
    commit itself when nothing waits on it (no thread, batch or observer)."""
    state, rt = d.state, d.rt
    _trace_failed_attempts(d, reason)
    state.status = status
    state.finish_reason = reason
    state.finished_at = time.time()
    parked, state.parked = state.parked, None
    batch_step.forget(rt, state)  # a request it left parked for a provider batch is not sent
    if parked is not None:  # ended while parked: a decision arriving from now on is refused
        tracing.resume_trace(state, parked.step_trace)
        ids = [a.approval_id for a in parked.approvals]
        rt.approvals.cancel(ids, time.time(), f"turn {status.value}", tenant_of(state))
    batch = state.metadata.get("batch_id")
    # with nothing to run between the stored end and its announcement, the commit writes `turn-finish` itself
    # (no round trip of its own); else the hooks run first: a reader that sees it may continue at once
    announced = state.thread_id is None and not isinstance(batch, str) and not d.observers
    if not d.commit(announce=(EventType.TURN_FINISH, _turn_finish_data(d, status, reason)) if announced else None):
        return none(StepLoss.COMMIT_LOST)
    start_next = threads.turn_finished(rt, state)  # before turn-finish: a reader may continue at once
    TURNS.labels(state.agent, status.value).inc()
    if parked is not None:  # cancelled while parked: its approvals no longer wait for anyone
        untrack_pending(rt, *[a.approval_id for a in parked.approvals])
    ended = TurnEnd(drive=False)
    if isinstance(batch, str):  # counted, a driven batch's result written, its next item claimed for us
        item_key = str(state.metadata.get("item_key", ""))
        ended = rt.batches.turn_ended(batch, state, result_line(item_key, state))
    follow_ups: tuple[str, ...] = ()
    if d.observers:  # the hooks and spans of the last step and of the turn (committed), before turn-finish
        lifecycle.step_committed(d, state.step)
        follow_ups = _continue_thread(d, lifecycle.turn_committed(d))
    if not announced:
        d.emitter.publish(EventType.TURN_FINISH, _turn_finish_data(d, status, reason))
    return replace(
        none(f"turn {status.value}"),
        start=(*maybe(start_next), *follow_ups),
        batch=batch if ended.drive and isinstance(batch, str) else "",
        claim=ended.claim,
    )


def _trace_failed_attempts(d: Delivery, reason: FinishReason) -> None:
    """The step ended on its failed attempts: they still get their trace."""
    state = d.state
    if not state.failed_attempts and not state.attempts:
        return
    failed, state.failed_attempts = state.failed_attempts, []
    trace = StepTrace(
        step=state.step,
        provider=state.provider,
        model=state.model,
        cost=add_costs(*(f.cost for f in failed)),
        failed_attempts=failed,
        retries=state.attempt,
        stop_reason=reason.value,
        fingerprint=state.running_fingerprint,
        agent_version=state.running_version,
    )
    lifecycle.stamp(trace, d)
    state.trace.steps.append(trace)


def _continue_thread(d: Delivery, prompts: list[str]) -> tuple[str, ...]:
    """`on_turn_finish` asked for a follow-up: the thread's next turn, queued after this one (its first step
    to send now when the thread is free). A turn outside a thread has nothing to continue: logged."""
    state = d.state
    if not prompts:
        return ()
    if state.thread_id is None:
        log.warning("on_turn_finish of turn %s returned a follow-up, but the turn is not in a thread", state.turn_id)
        return ()
    sent: list[str] = []
    for prompt in prompts:
        try:
            continued = threads.continue_thread(d.rt, state.thread_id, prompt=prompt, multitask="enqueue")
        except StepqError as exc:
            log.warning("on_turn_finish's follow-up for thread %s was not stored: %s", state.thread_id, exc)
            continue
        sent += continued.send
    return tuple(sent)


def _turn_finish_data(d: Delivery, status: TurnStatus, reason: FinishReason) -> dict[str, Any]:
    state = d.state
    return {
        "status": status.value,
        "finish_reason": reason.value,
        "stopped_by": state.stopped_by.value if state.stopped_by else None,
        "stop_detail": state.stop_detail,
        "text": state.text,
        "object": state.object,
        "usage": state.usage.model_dump(),
        "cost": state.cost,
        "error": state.error,
        "trace": state.trace.summary(),
    }
