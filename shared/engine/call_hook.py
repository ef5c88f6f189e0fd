"""The agent's `prepare_call` hook: run once per turn, before its first model call.

What it returns (the turn's model, extra instructions, a new runtime context) is set on the turn and stored
with the commit that starts it, together with `call_prepared`, so a redelivered step (a crash, a retry, a
lost lease after that commit) never calls the hook again. A worker dying between the hook and that commit
runs it again on the next delivery: nothing of the first run was stored.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import ValidationError

from stepq.agents import runtime_context
from stepq.agents.definition import AgentDefinition
from stepq.agents.runtime_context import CallContext, CallOverrides
from stepq.errors import StepqError
from stepq.models import TurnState
from stepq.providers.registry import known_providers, split_shorthand

log = logging.getLogger("stepq.engine")


class PrepareCallError(StepqError):
    """The agent's prepare_call raised or returned something that is not call overrides: the turn fails."""


def prepare(agent: AgentDefinition, state: TurnState) -> bool:
    """Call the agent's prepare_call and apply its answer to the turn; True: the turn changed (commit it)."""
    fn = agent.prepare_call
    if fn is None or state.call_prepared:
        return False
    context = CallContext(
        turn_id=state.turn_id,
        agent=agent.id,
        provider=state.provider,
        model=state.model,
        context=runtime_context.typed(agent.context_schema, state.context),
        metadata=dict(state.metadata),
    )
    try:
        answer = fn(context)
    except Exception as exc:
        log.exception("prepare_call of agent %s raised", agent.id)
        raise PrepareCallError(f"prepare_call of agent {agent.id} raised {type(exc).__name__}: {exc}") from exc
    overrides = _parse(agent, answer)
    state.call_prepared = True
    if overrides is None:
        return True
    if overrides.instructions:
        state.instructions = overrides.instructions
    if overrides.context is not None:
        try:
            state.context = runtime_context.check_context(
                agent.id, agent.context_schema, overrides.context, "prepare_call's context"
            )
        except runtime_context.ContextError as exc:
            raise PrepareCallError(f"prepare_call of agent {agent.id}: {exc}") from None
    if overrides.model is not None:
        provider, model = split_shorthand(None, overrides.model)
        provider = provider or state.provider
        if provider not in known_providers():
            raise PrepareCallError(f"prepare_call of agent {agent.id} chose unknown provider {provider!r}")
        if model:
            state.provider, state.model = provider, model
            state.sources["model"] = "agent"
    return True


def _parse(agent: AgentDefinition, answer: object) -> CallOverrides | None:
    if answer is None or isinstance(answer, CallOverrides):
        return answer
    if not isinstance(answer, Mapping):
        raise PrepareCallError(
            f"prepare_call of agent {agent.id} returned {type(answer).__name__}; return CallOverrides, a dict or None"
        )
    try:
        return CallOverrides.model_validate(dict(answer))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PrepareCallError(
            f"prepare_call of agent {agent.id} returned bad overrides: {first['msg']} at {where}"
        ) from None
