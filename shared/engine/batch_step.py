"""Where a provider-batch turn's model call goes: parked for a provider batch, answered by one, or online.

A turn submitted with `provider_batch=True` (batch priority) does not call the model while a worker
waits. Its step stores the built request in the collector (`stepq.store.pbatch`) and parks; the
periodic tick (`stepq.batches.provider`) sends it in a batch, records the answer and sends the step
again. That delivery finds the answer here and the step goes on exactly as a streamed one would.

Answers arrive whole, so a failed request has no before/after-content distinction: it is a failed
attempt under the engine's usual retry budget (the retry parks again, in the next batch). When that
budget is spent, or the request is still unanswered at its deadline, the step runs online instead
(the deadline always; spent attempts when STEPQ_PROVIDER_BATCH_ONLINE_FALLBACK allows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.engine.emitter import StepEmitter
from stepq.fleet.runtime import Runtime
from stepq.models import Delta, ReasoningPart, StepOutput, TextPart, TurnState, TurnStatus
from stepq.providers.base import ProviderAdapter, ProviderError, StepRequest
from stepq.store.pbatch import ProviderBatchStore, custom_id


@dataclass(frozen=True)
class Park:
    """The request is queued for a provider batch: commit the turn as awaiting_batch."""

    custom_id: str


@dataclass(frozen=True)
class Waiting:
    """Still parked and unanswered (a delivery that came early, e.g. the sweeper's): nothing to do."""


@dataclass(frozen=True)
class Online:
    """Run this step online now, and why."""

    reason: str


Route = StepOutput | ProviderError | Park | Waiting | Online


def store_for(rt: Runtime) -> ProviderBatchStore:
    return ProviderBatchStore(rt.redis, rt.keys, rt.settings.event_ttl_s, rt.settings.redis_cluster)


def applies(state: TurnState, adapter: ProviderAdapter) -> bool:
    """A provider-batch turn, on a provider with a batch API, whose step has not been sent online."""
    if not state.provider_batch or state.priority != "batch" or state.batch_online_step == state.step:
        return False
    return adapter.batch_api() is not None


def route(rt: Runtime, state: TurnState, agent: AgentDefinition, request: StepRequest, tenant: str | None) -> Route:
    """Take the batch's answer for this step, or queue its request, or give it up for an online call.
    `tenant`: the tenant whose own provider key this step uses (None: the fleet's); its requests go in
    batches of their own (group `provider/model@tenant`), never beside another tenant's or the fleet's."""
    store = store_for(rt)
    custom = custom_id(state.turn_id, state.step, state.attempt)
    outcome = store.outcome(state.turn_id, custom)
    if outcome is None and state.status == TurnStatus.AWAITING_BATCH:
        if not state.batch_deadline_at or time.time() < state.batch_deadline_at:
            return Waiting()
        store.abandon(state.turn_id, custom)  # from now on a late answer is dropped...
        outcome = store.outcome(state.turn_id, custom)  # ...unless it was recorded just before
        if outcome is None:
            return Online("the provider batch did not answer before STEPQ_PROVIDER_BATCH_DEADLINE_S; running online")
    if outcome is None:
        payload = {
            "agent": agent.id,
            "provider": state.provider,
            "model": state.model,
            "request": request.model_dump(mode="json"),
        }
        group = f"{state.provider}/{state.model}"
        if tenant is not None:
            payload["tenant"] = tenant  # the tick sends the batch with this tenant's key, read when it sends
            group += f"@{tenant}"
        store.queue(state.turn_id, group, custom, payload, time.time())
        return Park(custom)
    return _answer(rt, state, outcome)


def _answer(rt: Runtime, state: TurnState, outcome: dict[str, Any]) -> Route:
    if outcome.get("output") is not None:
        output = StepOutput.model_validate(outcome["output"])
        output.batched = True
        return output
    error = outcome.get("error")
    if not isinstance(error, dict):
        return Online("the request expired inside its provider batch; running online")
    exc = ProviderError(
        str(error.get("message") or "failed inside a provider batch"),
        retryable=bool(error.get("retryable")),
        status=error.get("status"),
        code=error.get("code"),
    )
    spent = state.attempt + 1 >= rt.settings.retry_max_attempts
    if exc.retryable and spent and rt.settings.provider_batch_online_fallback:
        return Online(f"every provider-batch attempt failed ({exc.describe()}); running online")
    return exc


def forget(rt: Runtime, state: TurnState) -> None:
    """A provider-batch turn ended: a request it left parked is not sent (or applied) any more."""
    if state.provider_batch:
        store_for(rt).drop(state.turn_id)


def replay(output: StepOutput, emitter: StepEmitter) -> None:
    """A batch answer arrives whole: its text goes out as deltas, as a streamed step's would."""
    for part in output.message.parts:
        if isinstance(part, TextPart) and part.text:
            emitter.emit(Delta("text", part.text))
        elif isinstance(part, ReasoningPart) and part.text:
            emitter.emit(Delta("reasoning", part.text))
