"""Provider names -> adapter factories, and model resolution for a turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.errors import SubmitError
from shared.providers.base import ProviderAdapter
from shared.providers.scripted import ScriptedAdapter

if TYPE_CHECKING:
    from shared.agents import AgentDefinition

AdapterFactory = Callable[["AgentDefinition", str], ProviderAdapter]


def _scripted(agent: AgentDefinition, model: str) -> ProviderAdapter:
    if not agent.script:
        raise SubmitError(f"agent {agent.id} has no `script`, so it cannot run on the scripted provider")
    return ScriptedAdapter(agent.script)


_FACTORIES: dict[str, AdapterFactory] = {"scripted": _scripted}


def register_provider(name: str, factory: AdapterFactory) -> None:
    _FACTORIES[name] = factory


def known_providers() -> list[str]:
    return sorted(_FACTORIES)


def create_adapter(provider: str, agent: AgentDefinition, model: str) -> ProviderAdapter:
    factory = _FACTORIES.get(provider)
    if factory is None:
        raise SubmitError(f"unknown provider {provider!r}; known: {', '.join(known_providers())}")
    return factory(agent, model)


def split_shorthand(provider: str | None, model: str | None) -> tuple[str | None, str | None]:
    """`provider/model` shorthand in the model field fills the provider when it is not given."""
    if model and "/" in model and provider is None:
        head, tail = model.split("/", 1)
        if head in _FACTORIES:
            return head, tail
    return provider, model


def resolve_model(
    agent: AgentDefinition,
    provider: str | None,
    model: str | None,
    env_provider: str | None,
    env_model: str | None,
) -> tuple[str, str]:
    """Per-turn choice (only if the agent allows it) > agent default > environment."""
    provider, model = split_shorthand(provider, model)
    if (provider or model) and not agent.allow_runtime_override:
        raise SubmitError(f"agent {agent.id} does not allow choosing the provider or model per turn")
    default_provider, default_model = split_shorthand(agent.default_provider, agent.default_model)
    env_p, env_m = split_shorthand(env_provider, env_model)
    chosen_provider = provider or default_provider or env_p
    if chosen_provider is None:
        if agent.script:
            chosen_provider = "scripted"
        else:
            raise SubmitError(f"no provider for agent {agent.id}: set default_provider on the agent or AGENTQ_PROVIDER")
    if chosen_provider not in _FACTORIES:
        raise SubmitError(f"unknown provider {chosen_provider!r}; known: {', '.join(known_providers())}")
    chosen_model = model or default_model or env_m or ("scripted" if chosen_provider == "scripted" else None)
    if chosen_model is None:
        raise SubmitError(f"no model for agent {agent.id} on {chosen_provider}: set default_model or AGENTQ_MODEL")
    return chosen_provider, chosen_model
