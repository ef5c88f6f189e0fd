"""Agents and tools for the step-cost guards (tests/test_step_costs.py): one agent per kind of step.

The tools touch nothing outside their arguments (no Redis, no JSON), so every round trip and JSON
call the guards count is the engine's own. Each script runs its kind of step twice, then answers:
the guard counts the second delivery (step 1), the steady state of a turn whose step 0 warmed the
process's caches the way the steps of a long turn do (bench.step_overhead's turns of N steps).
"""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

DELTA_CHARS = 4  # the scripted model streams its text in deltas of this many characters


@tool
def cost_nop(n: int) -> dict[str, int]:
    """Return the number it was given (bench.step_overhead's trivial tool: no context, no flags)."""
    return {"n": n}


@tool
def cost_read(key: str, ctx: ToolContext) -> dict[str, str]:
    """Read something (a read-only tool that takes the tool context, as a real lookup tool does)."""
    return {"key": key, "turn": ctx.turn_id}


@tool(destructive=True)
def cost_delete(label: str, ctx: ToolContext) -> dict[str, str]:
    """Delete something (a tool with side effects that no approval gates under `confirm-required`): it must
    run once, so the step's checkpoint is stored before it runs and its result right after."""
    return {"label": label, "key": ctx.idempotency_key}


@tool(is_mutation=True)
def cost_write(label: str, ctx: ToolContext) -> dict[str, str]:
    """Change something (a mutation tool: the step parks for a person's approval, the resumed step runs it)."""
    return {"label": label, "key": ctx.idempotency_key}


def _tool_step(*calls: ScriptToolCall) -> ScriptStep:
    return ScriptStep(text="", tool_calls=list(calls))


_NOP = ScriptToolCall(name="cost_nop", args={"n": 1})
_READ = ScriptToolCall(name="cost_read", args={"key": "a"})
_READ_2 = ScriptToolCall(name="cost_read", args={"key": "b"})
_DELETE = ScriptToolCall(name="cost_delete", args={"label": "x"})
_WRITE = ScriptToolCall(name="cost_write", args={"label": "x"})
_DONE = ScriptStep(text="done")

plain = AgentDefinition(
    id="cost.plain",
    allowed_tools=["cost_nop"],
    loop=LoopConfig(max_steps=10),
    script=[_tool_step(_NOP), _tool_step(_NOP), _DONE],
)

read_only = AgentDefinition(
    id="cost.read_only",
    allowed_tools=["cost_read"],
    loop=LoopConfig(max_steps=10),
    script=[_tool_step(_READ, _READ_2), _tool_step(_READ, _READ_2), _DONE],  # two read-only calls a step
)

side_effect = AgentDefinition(
    id="cost.side_effect",
    allowed_tools=["cost_delete"],
    read_only=False,
    mutation_policy="confirm-required",
    loop=LoopConfig(max_steps=10),
    script=[_tool_step(_DELETE), _tool_step(_DELETE), _DONE],
)

mutation = AgentDefinition(
    id="cost.mutation",
    allowed_tools=["cost_write"],
    read_only=False,
    mutation_policy="confirm-required",
    loop=LoopConfig(max_steps=10),
    script=[_tool_step(_WRITE), _tool_step(_WRITE), _DONE],
)


def _streamed(deltas: int) -> AgentDefinition:
    """Step 0 a plain tool step; step 1 the final answer, streamed as exactly `deltas` text deltas."""
    return AgentDefinition(
        id=f"cost.stream_{deltas}",
        allowed_tools=["cost_nop"],
        loop=LoopConfig(max_steps=10),
        script=[_tool_step(_NOP), ScriptStep(text="x" * (DELTA_CHARS * deltas), delta_chars=DELTA_CHARS)],
    )


STREAM_DELTAS = (1, 10, 50)  # the guards' K: one delta (a short answer), and two lengths for the per-delta slope
stream_1, stream_10, stream_50 = (_streamed(k) for k in STREAM_DELTAS)

first_stream = AgentDefinition(
    id="cost.first_stream",
    loop=LoopConfig(max_steps=10),
    script=[ScriptStep(text="x" * (DELTA_CHARS * 10), delta_chars=DELTA_CHARS)],
)  # step 0 the final answer, streamed as 10 text deltas: a new turn's first step
