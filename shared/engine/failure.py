"""A failed model call (the step's own, or compaction's summary call): bill it, retry it, fail over, or fail.

A retry is allowed only before the step streamed content (unless the agent opts into retrying after
it), waits the provider's Retry-After or a jittered backoff (engine/retry.py), and is a commit of the
turn with its next `not_before`. When the attempts are spent before any content, the step moves to the
next fallback model; otherwise the turn fails, saying after how many attempts and why. Streamed tool input
is not content in that sense (the retry is allowed as before), but a retry or failover after it publishes a
`step-reset` so subscribers drop the partial call.
"""

from __future__ import annotations

import time

from stepq.engine import lifecycle
from stepq.engine.context import Decision, Delivery, StepContext, emitter_text, none
from stepq.engine.finish import fail
from stepq.engine.pricing import add_costs, step_cost
from stepq.engine.retry import next_fallback, retry_countdown
from stepq.fleet.metrics import record_retry, record_usage, retry_reason
from stepq.models import EventType, FailedAttempt, Fallback, StepLoss, TurnStatus, Usage
from stepq.providers.base import ProviderError


def count_failed_attempt(d: Delivery, exc: ProviderError) -> None:
    """Tokens the provider reported before the call failed are billed: the turn's totals count them,
    and the step's trace lists the attempt (written with the step, or with the turn's end)."""
    usage = exc.usage
    if not isinstance(usage, Usage) or not (usage.total_tokens or usage.cache_read_tokens or usage.cache_write_tokens):
        return
    state = d.state
    cost = step_cost(d.rt.settings.prices, state.provider, state.model, usage)
    state.usage = state.usage + usage
    state.cost = add_costs(state.cost, cost)
    state.failed_attempts.append(
        FailedAttempt(
            attempt=state.attempt,
            usage=usage,
            cost=cost,
            error=retry_reason(exc),
            provider=state.provider,
            model=state.model,
        )
    )
    record_usage(state.agent, d.tenant(), state.provider, state.model, usage, cost)


def provider_failure(ctx: StepContext, exc: ProviderError) -> Decision:
    """Retry the step after a countdown, fail over to the next fallback, or fail the turn."""
    state, emitter, s = ctx.state, ctx.emitter, ctx.rt.settings
    emitted = emitter.emitted_content
    may_retry = exc.retryable and (not emitted or ctx.agent.retry_after_emission)
    if not may_retry:
        lifecycle.attempt_ended(ctx, "error", error=exc)
        if emitted:
            state.text = emitter_text(emitter)
            return fail(ctx, f"provider error after content was streamed: {exc.describe()}")
        return fail(ctx, f"provider error: {exc.describe()}")
    attempt = state.attempt + 1
    if attempt >= s.retry_max_attempts:
        fallbacks = ctx.agent.fallbacks or s.fallbacks
        fallback = None if emitted else next_fallback(fallbacks, state.provider, state.model)
        if fallback is not None:
            lifecycle.attempt_ended(ctx, "failover", error=exc)
            return fail_over(ctx, exc, fallback, attempt)
        lifecycle.attempt_ended(ctx, "error", error=exc)
        return fail(ctx, f"provider error after {attempt} attempts: {exc.describe()}")
    lifecycle.attempt_ended(ctx, "retry", error=exc)
    countdown = retry_countdown(exc.retry_after_s, state.attempt, s.retry_base_s, s.retry_cap_s)
    if emitted or emitter.emitted_tool_input:
        ctx.rt.turns.clear_emitted(state.turn_id)
        emitter.publish(EventType.STEP_RESET, {"reason": "retrying after partial output"})
    emitter.publish(
        EventType.STEP_RETRY,
        {
            "attempt": attempt,
            "countdown": countdown,
            "error": exc.message,
            "status": exc.status,
            "code": exc.code,
            "retry_after": exc.retry_after_s,
        },
    )
    state.attempt = attempt
    state.not_before = time.time() + countdown
    if state.status == TurnStatus.QUEUED:
        state.status = TurnStatus.RUNNING
    if not ctx.commit():
        return none(StepLoss.COMMIT_LOST)
    record_retry(state.provider, state.model, exc)
    return Decision("retry", step=state.step, countdown=countdown, attempt=attempt)


def fail_over(d: Delivery, exc: ProviderError, fallback: Fallback, attempts: int) -> Decision:
    """The step's attempts are spent before any content: its next attempt (and the rest of the turn) goes
    to the next fallback. Each adapter maps the canonical transcript, so nothing else changes."""
    state = d.state
    if d.emitter.emitted_tool_input:  # a partial tool call went out: the fallback's attempt starts clean
        d.rt.turns.clear_emitted(state.turn_id)
        d.emitter.publish(EventType.STEP_RESET, {"reason": "retrying after partial output"})
    d.emitter.publish(
        EventType.STEP_RETRY,
        {
            "attempt": 0,
            "countdown": 0.0,
            "error": exc.message,
            "status": exc.status,
            "code": exc.code,
            "retry_after": exc.retry_after_s,
            "reason": f"failover after {attempts} attempts on {state.provider}/{state.model}",
            "from": {"provider": state.provider, "model": state.model},
            "fallback": fallback.model_dump(),
        },
    )
    record_retry(state.provider, state.model, exc)
    state.provider, state.model = fallback.provider, fallback.model
    state.sources["model"] = "fallback"
    state.attempt = 0
    state.not_before = None
    if state.status == TurnStatus.QUEUED:
        state.status = TurnStatus.RUNNING
    if not d.commit():
        return none(StepLoss.COMMIT_LOST)
    return Decision("retry", step=state.step, countdown=0.0, attempt=0, reason="failover")
