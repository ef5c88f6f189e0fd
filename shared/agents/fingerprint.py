"""An agent definition's fingerprint: a stable hash of what a running turn depends on.

A turn is a transcript plus state, and every step is a fresh task that may run on newer code. What the
transcript and the stored state commit a turn to are the tools it may call and their argument schemas, the
object-mode output schema, the execution mode, what may run without approval, and the prompt's declared
version: those are hashed, part by part, into an `AgentVersion` the turn keeps. Prompt text, descriptions,
models and limits are not: changing them never strands a turn.

The hash is sha256 over canonical JSON (sorted keys, no whitespace), so it is the same in every process,
whatever the Python hash seed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.models import AgentVersion


def canonical(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same text for the same value in any process."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()


def mutation_gate(agent: AgentDefinition) -> str:
    """What may run without a person: `read-only` when writes are hidden, else the mutation policy."""
    return agent.mutation_policy if agent.writes_allowed else "read-only"


def version_of(agent: AgentDefinition) -> AgentVersion:
    """The agent's `AgentVersion`, computed once per definition object (again after its tools are re-bound)."""
    known = agent._version
    if known is not None and known[0] == id(agent):  # not a copy's (model_copy copies private attributes)
        cached: AgentVersion = known[1]
        return cached
    tools = {t.name: t.input_schema for t in agent.visible_tools()}
    output = agent.output_schema() if agent.execution_mode == "object" else None
    gate = mutation_gate(agent)
    parts = {
        "tools": tools,
        "output": output,
        "execution_mode": agent.execution_mode,
        "mutation_policy": gate,
        "prompt_version": agent.prompt_version,
    }
    version = AgentVersion(
        fingerprint=digest(parts),
        version=agent.version,
        prompt_version=agent.prompt_version,
        tools={name: digest(schema)[:16] for name, schema in sorted(tools.items())},
        output=digest(output)[:16] if output is not None else None,
        execution_mode=agent.execution_mode,
        mutation_policy=gate,
        on_incompatible=agent.on_incompatible_upgrade,
    )
    agent._version = (id(agent), version)
    return version
