"""What a user writes: agent definitions, tools, extensions and overrides, MCP tools, task plans,
stop conditions, per-step control, per-module model defaults, and the bundled demo agents.

May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.cancel`, `stepq.config`, `stepq.logging`,
`stepq.providers`.
Definitions sit below the engine, the store, the fleet, policy, turns, batches, the workers and the producer;
the providers sit below them (they read an agent through protocols). What a definition checks against
that lives higher up is data in `stepq.models` (the media types an attachment may carry).

`from stepq.agents import AgentDefinition` is the documented import path; the names below are re-exported
from `stepq.agents.definition`, where they live.
"""

from stepq.agents.definition import AgentDefinition, Budget, ExecutionMode, LoopConfig, StopWhen, check_agent
from stepq.agents.registry import AgentRegistry, registry

__all__ = [
    "AgentDefinition",
    "AgentRegistry",
    "Budget",
    "ExecutionMode",
    "LoopConfig",
    "StopWhen",
    "check_agent",
    "registry",
]
