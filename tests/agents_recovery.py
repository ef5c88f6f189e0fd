"""Agents and tools for the crash-recovery and outage tests (scripted provider)."""

from __future__ import annotations

import os
import time

import redis

from stepq.agents import AgentDefinition
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.tools import ToolContext, tool

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
