"""The benchmark agent: a zero-latency scripted model that calls one trivial tool every step.

The script's single entry repeats, so a turn runs exactly `max_steps` steps (the caller
tightens `loop.max_steps` per turn) and ends with finish reason `max-steps`.
"""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import tool
from stepq.providers.base import ProviderAdapter
from stepq.providers.registry import register_provider
from stepq.providers.scripted import ScriptedAdapter, ScriptStep, ScriptToolCall

MAX_STEPS = 1000  # the most LoopConfig allows; a turn asks for fewer with loop={"max_steps": n}


@tool
def bench_nop(n: int) -> dict[str, int]:
    """Return the number it was given (a trivial tool)."""
    return {"n": n}


overhead = AgentDefinition(
    id="bench.overhead",
    system_prompt="benchmark",
    allowed_tools=["bench_nop"],
    loop=LoopConfig(max_steps=MAX_STEPS),
    script=[ScriptStep(text="", tool_calls=[ScriptToolCall(name="bench_nop", args={"n": 1})])],
)


class _MeasuredScripted(ScriptedAdapter):
    """The scripted model, taken to report real usage: compaction's cheap gate (the last call's usage plus
    what was added since) applies to it as to a real provider's."""

    usage_is_measured = True


def _measured_factory(agent: AgentDefinition, model: str) -> ProviderAdapter:
    return _MeasuredScripted(agent.script or [])


register_provider("bench-measured", _measured_factory)

overhead_measured = AgentDefinition(
    id="bench.overhead_measured",
    system_prompt="benchmark",
    allowed_tools=["bench_nop"],
    loop=LoopConfig(max_steps=MAX_STEPS),
    default_provider="bench-measured",
    default_model="bench-model",
    script=[ScriptStep(text="", tool_calls=[ScriptToolCall(name="bench_nop", args={"n": 1})])],
)
