"""What a user writes: agent definitions, tools, extensions and overrides, MCP tools, task plans,
stop conditions, per-step control, per-module model defaults, and the bundled demo agents.

May import: the package root's leaves (`errors`, `models`, `config`, `logging`, `cancel`), the providers'
interface and registry (`providers.base`, `providers.registry`, the offline models). Never the engine, the
store, the fleet, policy, turns, batches, the workers or the producer: definitions sit below all of them.

`from stepq.agents import AgentDefinition` is the documented import path; the names below are re-exported
from `stepq.agents.definition`, where they live.
"""

from stepq.agents.definition import (
    AgentDefinition,
    AgentRegistry,
    Budget,
    ExecutionMode,
    LoopConfig,
    StopWhen,
    check_agent,
    registry,
)

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
