"""What `stepq agents` and `GET /v1/agents` both show of an agent for a picker or a router: its label, search
keywords, domain and data capabilities, and the models it may run. One function, so the CLI and the gateway
never disagree about an agent."""

from __future__ import annotations

from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.config import module_models
from stepq.config.settings import Settings
from stepq.models import Policy
from stepq.policy.resolution import allowed_patterns, base_sources, layers_for, resolve
from stepq.providers.registry import choose_model


def picker_fields(agent: AgentDefinition, settings: Settings, caller: Policy | None = None) -> dict[str, Any]:
    """The picker metadata and the models of one agent under this process's STEPQ_POLICY (and a caller's policy,
    such as a gateway credential's). `allowed_models` is what the policies' model allowlists admit; where none
    lists models, it is the agent's default model and its fallbacks, the only models it runs unasked."""
    module = module_models.for_agent(settings.module_models, agent.id)
    provider, model = choose_model(agent, None, None, settings.provider, settings.model, module)
    default = f"{provider}/{model}" if provider and model else None
    layers = layers_for(agent.id, caller=caller, environment=settings.policy, presets=settings.budget_presets)
    allowed = allowed_patterns(layers)
    if allowed is None:
        fallbacks = [f"{f.provider}/{f.model}" for f in agent.fallbacks or settings.fallbacks]
        allowed = list(dict.fromkeys([default, *fallbacks] if default else fallbacks))
    ceiling = resolve(agent, agent.loop.limits(), base_sources(agent), layers)
    return {
        "label": agent.label,
        "keywords": agent.keywords,
        "domain": agent.domain,
        "data_capabilities": agent.data_capabilities,
        "default_model": default,
        "allowed_models": allowed,
        "model_choice": ceiling.runtime_override,
    }
