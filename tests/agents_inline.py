"""Agents and tools for the inline-steps tests (tests/test_inline_steps.py): turns of several tool steps.

`inline_gate` lets a test act while a step is running: it announces that it started (a Redis list push),
then blocks until the test opens it (another push), so the test knows where the turn is without sleeping.
"""

from __future__ import annotations

import os

import redis

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

_redis = redis.Redis.from_url(os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)

TOOL_STEPS = 4  # inline.loop's tool steps before its answer


def entered_key(prefix: str, name: str) -> str:
    return f"{prefix}:inline-entered:{name}"


def open_key(prefix: str, name: str) -> str:
    return f"{prefix}:inline-open:{name}"


@tool
def inline_nop(n: int) -> dict[str, int]:
    """Return the number it was given."""
    return {"n": n}


@tool
def inline_gate(name: str, ctx: ToolContext) -> dict[str, object]:
    """Say it started, then block until the test opens the gate (at most 60 s)."""
    prefix = str(ctx.metadata["prefix"])
    _redis.rpush(entered_key(prefix, name), ctx.turn_id)
    opened = _redis.blpop([open_key(prefix, name)], timeout=60)
    return {"gate": name, "opened": opened is not None}


def _nop(n: int) -> ScriptStep:
    return ScriptStep(text="", tool_calls=[ScriptToolCall(name="inline_nop", args={"n": n})])


loop = AgentDefinition(
    id="inline.loop",
    allowed_tools=["inline_nop"],
    loop=LoopConfig(max_steps=10),
    script=[*(_nop(n) for n in range(TOOL_STEPS)), ScriptStep(text="done")],
)

gated = AgentDefinition(
    id="inline.gated",
    allowed_tools=["inline_gate", "inline_nop"],
    loop=LoopConfig(max_steps=10),
    script=[
        ScriptStep(text="", tool_calls=[ScriptToolCall(name="inline_gate", args={"name": "a"})]),
        _nop(1),
        ScriptStep(text="done"),
    ],
)
