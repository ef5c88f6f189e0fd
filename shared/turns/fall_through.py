"""Provider fall-through at submit: an agent whose default provider this deployment has not configured runs on
the next configured provider of its list, when the agent allows it (`fall_through_unconfigured=True`).

The order is the agent's own: its `default_provider`, then its `fallbacks` in order (STEPQ_FALLBACKS when it
lists none). Only the agent's default falls through: a provider the caller, a module setting or the fleet's
STEPQ_PROVIDER names was chosen on purpose, so an unconfigured one fails closed, as does an agent without
the flag. The turn's trace credits the model to the `fall-through` layer.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepq.agents.definition import AgentDefinition
from stepq.models import Fallback
from stepq.providers.registry import configuration_problem, first_configured, split_shorthand


def fall_through(agent: AgentDefinition, fleet_fallbacks: Sequence[Fallback]) -> tuple[str, str] | None:
    """The (provider, model) the agent falls through to, or None when it must fail closed: it does not allow
    fall-through, its default provider is configured after all, or nothing in its list is configured."""
    default, _ = split_shorthand(agent.default_provider, agent.default_model)
    if not agent.fall_through_unconfigured or default is None or configuration_problem(default) is None:
        return None
    listed = agent.fallbacks or fleet_fallbacks
    return first_configured((f.provider, f.model) for f in listed if f.provider != default)
