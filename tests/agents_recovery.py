"""Agents and tools for the crash-recovery and outage tests (scripted provider)."""

from __future__ import annotations

import os
import time

import redis

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

_redis = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)


def execution_key(prefix: str, turn_id: str, label: str, what: str) -> str:
    return f"{prefix}:executions:{turn_id}:{label}:{what}"


@tool(is_mutation=True)
def rc_slow_mutation(label: str, seconds: float, ctx: ToolContext) -> dict[str, object]:
    """A mutation that takes a while: records its start (and the pid running it), then its completion."""
    prefix = ctx.metadata["prefix"]
    _redis.set(execution_key(prefix, ctx.turn_id, label, "pid"), os.getpid())
    started = _redis.incr(execution_key(prefix, ctx.turn_id, label, "started"))
    time.sleep(seconds)  # the work itself (a long call to another system)
    _redis.incr(execution_key(prefix, ctx.turn_id, label, "done"))
    return {"label": label, "attempt": started, "idempotency_key": ctx.idempotency_key}


approved_slow_mutation = AgentDefinition(
    id="rc.approved_slow_mutation",
    allowed_tools=["rc_slow_mutation"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(
            text="writing",
            tool_calls=[ScriptToolCall(name="rc_slow_mutation", args={"label": "gated", "seconds": 3.0})],
        ),
        ScriptStep(text="written"),
    ],
)


def keys_seen(prefix: str, turn_id: str) -> str:
    """The list of idempotency keys `rc_held_mutation` was run with, one per run, in order."""
    return f"{prefix}:executions:{turn_id}:held:keys"


@tool(is_mutation=True, timeout_s=None)
def rc_held_mutation(ctx: ToolContext) -> dict[str, object]:
    """A mutation whose first run holds (until its worker is killed) and whose later runs finish at once; each
    run records its pid and its idempotency key first."""
    prefix = ctx.metadata["prefix"]
    _redis.set(execution_key(prefix, ctx.turn_id, "held", "pid"), os.getpid())
    run = _redis.rpush(keys_seen(prefix, ctx.turn_id), ctx.idempotency_key)
    if run == 1:
        ctx.cancelled.wait(timeout=180)  # the first run's call to another system: it never answers
    return {"run": run, "idempotency_key": ctx.idempotency_key}


approved_held_mutation = AgentDefinition(
    id="rc.approved_held_mutation",
    allowed_tools=["rc_held_mutation"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(text="writing", tool_calls=[ScriptToolCall(name="rc_held_mutation", args={})]),
        ScriptStep(text="written"),
    ],
)


@tool
def rc_not_finite() -> dict[str, object]:
    """Returns floats JSON cannot carry."""
    return {"nan": float("nan"), "list": [1.5, float("inf"), float("-inf")]}


not_finite_result = AgentDefinition(
    id="rc.not_finite_result",
    allowed_tools=["rc_not_finite"],
    script=[
        ScriptStep(text="measuring", tool_calls=[ScriptToolCall(name="rc_not_finite", args={})]),
        ScriptStep(text="measured"),
    ],
)


@tool(timeout_s=0.2)
def rc_slow_careful_effect(ctx: ToolContext) -> dict[str, object]:
    """Works longer than its timeout, checking the cancellation flag before it records its effect."""
    if ctx.cancelled.wait(timeout=30):  # the work; ends early once told to stop
        _redis.set(execution_key(ctx.metadata["prefix"], ctx.turn_id, "careful", "stopped"), 1)
        return {"stopped": True}
    _redis.incr(execution_key(ctx.metadata["prefix"], ctx.turn_id, "careful", "effect"))
    return {"done": True}


@tool(timeout_s=0.2)
def rc_slow_answer(seconds: float) -> dict[str, object]:
    """Ignores the cancellation flag and answers after its timeout."""
    time.sleep(seconds)
    return {"late": True}


timing_out = AgentDefinition(
    id="rc.timing_out",
    allowed_tools=["rc_slow_careful_effect", "rc_slow_answer"],
    script=[
        ScriptStep(
            text="slow things",
            tool_calls=[
                ScriptToolCall(name="rc_slow_careful_effect", args={}),
                ScriptToolCall(name="rc_slow_answer", args={"seconds": 1.0}),
            ],
        ),
        ScriptStep(text="gave up on them"),
    ],
)
