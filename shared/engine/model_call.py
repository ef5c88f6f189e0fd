"""The stage that gets the model's answer to a step: compaction first, then a replay, a provider batch, or a call.

`compact` runs before a step's first call when the transcript is over its share of the context window
(engine/compaction.py): the summary call is a traced step of its own, and the compacted transcript is
committed before the model sees it. `answer` then takes the first source that has the answer:
  * a checkpoint (the model answered this step before a crash): replayed, never asked again;
  * a provider batch (batch_step): the step parks for one, or takes the batch's answer;
  * the online call: rate limit, stream, and on failure engine/failure.py (retry, failover, fail).
Each returns the `StepOutput`, or the `Decision` the step ends on here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from stepq.engine import batch_step, lifecycle, stopping, tenant_keys
from stepq.engine.begin import ModelCall, with_files
from stepq.engine.compaction import Compactor, view
from stepq.engine.context import Decision, StepContext, emitter_text, none, worker_id
from stepq.engine.deadline import BUDGET_SPENT, step_deadline
from stepq.engine.failure import count_failed_attempt, provider_failure
from stepq.engine.finish import finish, finish_limit
from stepq.engine.pricing import add_costs, step_cost
from stepq.errors import StoreUnavailableError
from stepq.fleet.metrics import RATE_LIMIT_WAITS, FirstChunkProbe, record_usage
from stepq.fleet.ratelimit import RateLimit, estimate_tokens
from stepq.models import (
    Delta,
    EventType,
    FinishReason,
    LoopStop,
    ReasoningPart,
    StepLoss,
    StepOutput,
    StepTrace,
    TextPart,
    ToolSpec,
    TurnStatus,
)
from stepq.providers.base import ProviderError


def answer(ctx: StepContext, call: ModelCall) -> StepOutput | Decision:
    """The model's answer to this step: replayed from its checkpoint, from a provider batch, or called."""
    checkpoint = ctx.checkpoint
    if checkpoint is not None:  # the model already answered this step before a crash: replay, don't re-ask
        return replay(ctx, call, checkpoint)
    batched = provider_batch(ctx, call)
    return call_online(ctx, call) if batched is None else batched


def compact(ctx: StepContext, call: ModelCall) -> Decision | None:
    """Compaction (engine/compaction.py), stored before the model call; its summary call is a traced step.
    None: the call goes on (with the compacted request, when it compacted)."""
    state, lease, rt = ctx.state, ctx.lease, ctx.rt
    started = time.monotonic()
    compactor = Compactor(rt.settings, call.adapter, lambda msgs: with_files(ctx, msgs), lambda: lease.should_stop)
    try:
        done = compactor.run(state, call.request)
    except ProviderError as exc:  # the summary call failed: retried like the step's own call
        count_failed_attempt(ctx, exc)
        return provider_failure(ctx, exc)
    if lease.lost.is_set():
        return none(StepLoss.LEASE_LOST)
    if lease.cancelled.is_set():
        return finish(ctx, TurnStatus.CANCELLED, FinishReason.CANCELLED)
    if done is None:
        return None
    state.compaction = done.compaction
    if done.summary_output is not None:
        usage = done.summary_output.usage
        cost = step_cost(rt.settings.prices, state.provider, state.model, usage)
        state.usage = state.usage + usage
        state.cost = add_costs(state.cost, cost)
        state.trace.steps.append(
            StepTrace(
                step=state.step,
                provider=state.provider,
                model=state.model,
                usage=usage,
                cost=cost,
                duration_s=round(time.monotonic() - started, 4),
                stop_reason=done.summary_output.finish_reason.value,
                raw_stop_reason=done.summary_output.raw_finish_reason,
                kind="compaction",
                fingerprint=state.running_fingerprint,
                agent_version=state.running_version,
            )
        )
        record_usage(state.agent, ctx.tenant(), state.provider, state.model, usage, cost)
    ctx.emitter.publish(EventType.CONTEXT_COMPACTED, done.event())
    if not ctx.commit(release=False):
        return none(StepLoss.COMMIT_LOST)
    call.request = call.request.model_copy(update={"messages": with_files(ctx, view(state))})
    return None


def call_online(ctx: StepContext, call: ModelCall) -> StepOutput | Decision:
    """The model call: rate limit, stream, classify failures."""
    state, emitter, lease, limiter = ctx.state, ctx.emitter, ctx.lease, ctx.rt.limiter
    scope, limit = rate_limit(ctx)
    grant = None
    if limit.active:
        chars = sum(len(m.model_dump_json()) for m in state.messages) + len(ctx.agent.instructions or "")
        grant = limiter.acquire(scope, limit, estimate_tokens(chars, ctx.agent.max_output_tokens))
        if not grant.allowed:
            RATE_LIMIT_WAITS.labels(state.provider, state.model, grant.reason).inc()
            return Decision(
                "reschedule", step=state.step, countdown=grant.wait_s, reason=f"rate limit ({grant.reason})"
            )
    granted_at = grant.at if grant is not None else None
    defer_step_start(ctx, call.specs, granted_at=granted_at, refused=ctx.tools_refused)
    used: int | None = None
    guard = _EventWriteGuard(emitter.emit)
    probe = FirstChunkProbe(guard)  # times the first content delta (stepq_time_to_first_chunk_seconds)
    deadline = step_deadline(state, ctx.agent)
    lifecycle.model_requested(ctx, call.request)
    try:
        output = call.adapter.stream_step(call.request, probe, deadline.stop_check(lease))
        used = output.usage.total_tokens
    except ProviderError as exc:
        guard.raise_if_failed()  # our event write failed inside the stream: not the provider's error
        count_failed_attempt(ctx, exc)
        emitter.flush()
        if exc.status == 429:
            limiter.penalize(scope, limit, exc.retry_after_s)
        return provider_failure(ctx, exc)
    except Exception as exc:  # an adapter bug must not leave the turn hanging
        guard.raise_if_failed()
        if isinstance(exc, redis.RedisError):
            raise
        emitter.flush()
        return provider_failure(ctx, ProviderError(ctx.describe(exc), retryable=False))
    finally:
        probe.observe(state.provider, state.model)
        if grant is not None:
            limiter.release(scope, grant, used)
    if lease.lost.is_set():  # the heartbeat lost it; the commit is fenced on the lease anyway
        return none(StepLoss.LEASE_LOST)
    if lease.cancelled.is_set():
        state.text = emitter_text(emitter)
        return finish(ctx, TurnStatus.CANCELLED, FinishReason.CANCELLED)
    if deadline.cut:
        return budget_cut(ctx)
    return output


def budget_cut(ctx: StepContext) -> Decision:
    """The stream was stopped at the turn's deadline: a text turn ends with what it streamed, under the
    budget's stop; an object-mode turn drops the partial answer and runs this step again as its answer step."""
    state, emitter = ctx.state, ctx.emitter
    stop = LoopStop.WALL_CLOCK_BUDGET
    if ctx.agent.execution_mode != "object":
        state.text = emitter_text(emitter)
        return finish_limit(ctx, stop)
    stopping.answers_anyway(state, ctx.agent, stop)  # the step runs again as the answer step
    stopping.mark(state, stop)
    if emitter.emitted_content or emitter.emitted_tool_input:
        ctx.rt.turns.clear_emitted(state.turn_id)
        emitter.publish(EventType.STEP_RESET, {"reason": f"{BUDGET_SPENT}: answering now"})
    if not ctx.commit():
        return none(StepLoss.COMMIT_LOST)
    return Decision("retry", step=state.step, countdown=0.0, attempt=state.attempt)


def rate_limit(ctx: StepContext) -> tuple[str, RateLimit]:
    """The limit for this step's provider/model: the agent's own, else `provider/model`, else `provider`."""
    state = ctx.state
    scope = f"{state.provider}/{state.model}"
    if ctx.agent.rate_limit is not None:
        return scope, ctx.agent.rate_limit
    configured = ctx.rt.settings.rate_limits
    for key in (scope, state.provider):
        if key in configured:
            return key, configured[key]
    return scope, RateLimit()


def provider_batch(ctx: StepContext, call: ModelCall) -> StepOutput | Decision | None:
    """A provider-batch turn's model call: park it for a batch, or take the batch's answer (or its
    failure, under the usual retry budget). None: run it online (no batch API, deadline, spent)."""
    state, emitter = ctx.state, ctx.emitter
    if not batch_step.applies(state, call.adapter):
        return None
    routed = batch_step.route(ctx.rt, state, ctx.agent, call.request, tenant_keys.keyed_tenant(ctx))
    if isinstance(routed, batch_step.Waiting):
        return none("waiting for its provider batch")
    if isinstance(routed, batch_step.Park):
        return park_for_batch(ctx, routed.custom_id)
    state.status = TurnStatus.RUNNING
    state.batch_deadline_at = None
    if isinstance(routed, batch_step.Online):
        state.batch_online_step = state.step
        emitter.publish(EventType.STEP_RETRY, {"attempt": state.attempt, "countdown": 0.0, "error": routed.reason,
                                               "status": None, "code": "provider-batch", "retry_after": None,
                                               "reason": routed.reason})  # fmt: skip
        return None
    defer_step_start(ctx, call.specs)
    if isinstance(routed, ProviderError):
        emitter.flush()
        return provider_failure(ctx, routed)
    batch_step.replay(routed, emitter)
    return routed


def park_for_batch(ctx: StepContext, custom_id: str) -> Decision:
    """The request waits in the collector; the turn holds no worker until the tick brings its answer."""
    state = ctx.state
    state.status = TurnStatus.AWAITING_BATCH
    state.batch_deadline_at = round(time.time() + ctx.rt.settings.provider_batch_deadline_s, 3)
    if not ctx.commit():
        return none(StepLoss.COMMIT_LOST)
    ctx.emitter.publish(
        EventType.STEP_BATCHED,
        {"provider": state.provider, "model": state.model, "attempt": state.attempt,
         "custom_id": custom_id, "deadline_at": state.batch_deadline_at},
    )  # fmt: skip
    return none("parked for a provider batch")


def replay(ctx: StepContext, call: ModelCall, output: StepOutput) -> StepOutput:
    """Re-publish a checkpointed answer after the step-reset, so subscribers see the step whole."""
    emitter = ctx.emitter
    defer_step_start(ctx, call.specs, replayed=True, refused=ctx.tools_refused)
    for part in output.message.parts:
        if isinstance(part, TextPart) and part.text:
            emitter.emit(Delta("text", part.text))
        elif isinstance(part, ReasoningPart) and part.text:
            emitter.emit(Delta("reasoning", part.text))
    emitter.flush()
    return output


def defer_step_start(
    ctx: StepContext,
    specs: list[ToolSpec],
    replayed: bool = False,
    granted_at: float | None = None,
    refused: list[dict[str, str]] | None = None,
) -> None:
    """`step-start`: goes out with the first delta, or within the flush window."""
    state = ctx.state
    data: dict[str, Any] = {
        "attempt": state.attempt,
        "worker": worker_id(),
        "provider": state.provider,
        "model": state.model,
        "tools": [t.name for t in specs],  # exactly what the model is shown
    }
    version = state.agent_version
    if version is not None:  # which definition ran this step (the UI stream shows it, see data-agent-version)
        data["agent_version"] = {"fingerprint": version.short, "version": version.version}
    if replayed:
        data["replayed"] = True
    if refused:  # MCP tools whose server no longer advertises the pinned schema: name and reason
        data["tools_refused"] = refused
    if granted_at is not None:  # the rate limiter's grant (Redis clock): the time this call counts from
        data["rate_limit_granted_at"] = granted_at
    ctx.emitter.defer(EventType.STEP_START, data)


class _EventWriteGuard:
    """The adapter's `emit`, remembering a failed event write. An adapter may wrap whatever its stream loop
    raises into a ProviderError; a Redis outage outlasting the retry window must still surface as what it is,
    so the step is left to the sweeper and never fails the turn as `provider error after content`."""

    def __init__(self, emit: Callable[[Delta], None]) -> None:
        self._emit = emit
        self.failure: redis.RedisError | None = None

    def __call__(self, delta: Delta) -> None:
        try:
            self._emit(delta)
        except redis.RedisError as exc:
            self.failure = exc
            raise

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise StoreUnavailableError(
                f"Redis was unreachable while the step streamed: {type(self.failure).__name__}: {self.failure}"
            ) from self.failure
