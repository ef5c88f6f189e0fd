"""The lifecycle points of a step, in one place: what the agent's hooks (engine/hook_calls.py) and the
OpenTelemetry spans (engine/otel_spans.py) observe, so the two cannot drift.

  step start      before the first model call of a delivery (a re-run after a crash is marked);
  model request   the final request of an attempt, just before it is sent;
  attempt end     each model call's end: ok, retry, failover or error (recorded in the step's trace);
  tool result     each tool call of a committed step, with its duration;
  step finish     after the step's fenced commit advanced or ended the turn (never for a fenced-off re-run);
  turn finish     after the turn's end committed.

Every point is one boolean check (`d.observers`) when nothing observes; what the step's trace records
(attempts, tool durations, the step's start) is kept either way, since `stepq show --trace` shows it.
The last three points run after the commit, from what was committed: a crash between the commit and them
loses them (at most once), and a delivery whose commit was fenced off never reaches them.
"""

from __future__ import annotations

import time
from typing import Literal

from stepq.agents.definition import AgentDefinition
from stepq.engine import hook_calls, otel_spans
from stepq.engine.context import Delivery, StepContext, StepObserver
from stepq.models import AttemptTrace, StepTrace, ToolResultMessage, Usage
from stepq.providers.base import ProviderError, StepRequest

Outcome = Literal["ok", "retry", "failover", "error"]
_process_observers: list[StepObserver] | None = None  # this process's (the OTel exporter when configured)


def process_observers() -> list[StepObserver]:
    """The observers of every step this process runs, set up once from the environment (OTEL_*)."""
    global _process_observers
    if _process_observers is None:  # otel_spans imports nothing of OpenTelemetry unless configured
        exporter = otel_spans.from_environment()
        _process_observers = [exporter] if exporter is not None else []
    return _process_observers


def observers_for(agent: AgentDefinition) -> tuple[StepObserver, ...]:
    """Who observes this delivery: the process's observers, then the agent's hooks (if it has any)."""
    found = process_observers()
    if agent.has_hooks:
        return (*found, hook_calls.HookCalls(agent))
    return tuple(found)


def step_started(ctx: StepContext) -> None:
    """A delivery is about to call the model: the step's start is kept for its trace, then the observers."""
    state = ctx.state
    if state.step_started_at is None:
        state.step_started_at = time.time()
    for observer in ctx.observers:
        observer.step_started(ctx)


def model_requested(ctx: StepContext, request: StepRequest) -> None:
    """The attempt's final request goes out now."""
    ctx.attempt_started_at = time.time()
    for observer in ctx.observers:
        observer.model_requested(ctx, request)


def attempt_ended(
    d: Delivery,
    outcome: Outcome,
    *,
    usage: Usage | None = None,
    finish_reason: str | None = None,
    error: ProviderError | None = None,
    replayed: bool = False,
) -> None:
    """One model call ended: recorded in the step's attempts (its trace and `chat` span), then the observers."""
    state = d.state
    now = time.time()
    started = d.attempt_started_at or now
    attempt = AttemptTrace(
        attempt=state.attempt,
        provider=state.provider,
        model=state.model,
        started_at=round(started, 6),
        duration_s=round(now - started, 6),
        outcome=outcome,
        error=_error_type(error) if error is not None else None,
        usage=usage,
        finish_reason=finish_reason,
        replayed=replayed,
    )
    d.attempt_started_at = None
    state.attempts.append(attempt)
    for observer in d.observers:
        observer.attempt_ended(d, attempt)


def stamp(trace: StepTrace, d: Delivery) -> None:
    """Move what the step's deliveries gathered (attempts, start, re-run mark) into its trace."""
    state = d.state
    trace.attempts, state.attempts = state.attempts, []
    trace.started_at, state.step_started_at = state.step_started_at, None
    trace.rerun, state.step_rerun = state.step_rerun, False


def step_committed(d: Delivery, step: int) -> None:
    """After the fenced commit that advanced or ended the turn: the step's tool results, then its finish."""
    if not d.observers:
        return
    trace = _model_trace(d, step)
    if trace is None:  # the turn ended before this step called the model (a cancel, a limit, a policy)
        return
    last = d.state.messages[-1] if d.state.messages else None
    results = list(last.results) if isinstance(last, ToolResultMessage) and trace.calls else []
    for observer in d.observers:
        observer.step_finished(d, trace, results)


def turn_committed(d: Delivery) -> list[str]:
    """After the turn's end committed: the observers' follow-up prompts for its thread, in order."""
    if not d.observers:
        return []
    result = d.state.result()
    prompts = [observer.turn_finished(d, result) for observer in d.observers]
    return [p for p in prompts if p]


def _model_trace(d: Delivery, step: int) -> StepTrace | None:
    for trace in reversed(d.state.trace.steps):
        if trace.step == step and trace.kind == "model":
            return trace
        if trace.step < step:
            break
    return None


def _error_type(exc: ProviderError) -> str:
    """`error.type` of a failed attempt: its HTTP status or code, else its class (never its message)."""
    if exc.status is not None:
        return str(exc.status)
    return exc.code or type(exc).__name__
