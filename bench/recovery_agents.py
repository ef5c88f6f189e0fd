"""The agent `bench.recovery` kills workers under: a streamed answer, a read-only and a mutation tool that
count their own executions in Redis, and notice when they run although their result is already stored."""

from __future__ import annotations

import time

import redis

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.store.keys import Keys

_clients: dict[str, redis.Redis] = {}


def _redis(url: str) -> redis.Redis:
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, decode_responses=True)
    return _clients[url]


def counter_key(prefix: str, turn_id: str, tool_name: str, what: str) -> str:
    return f"{prefix}:bench-exec:{turn_id}:{tool_name}:{what}"


def _run(kind: str, ctx: ToolContext) -> dict[str, object]:
    prefix, url = ctx.metadata["prefix"], ctx.metadata["redis_url"]
    client = _redis(url)
    if client.hexists(Keys(prefix).tool_results(ctx.turn_id), ctx.tool_call_id):
        client.incr(counter_key(prefix, ctx.turn_id, kind, "after-stored"))  # must never happen
    client.incr(counter_key(prefix, ctx.turn_id, kind, "started"))
    time.sleep(0.8)  # the tool's work
    return {"kind": kind, "key": ctx.idempotency_key}


@tool
def bench_read(ctx: ToolContext) -> dict[str, object]:
    """A read-only lookup (safe to run again)."""
    return _run("read", ctx)


@tool(is_mutation=True)
def bench_write(ctx: ToolContext) -> dict[str, object]:
    """A mutation (hands its idempotency key to the system it changes)."""
    return _run("write", ctx)


recovery = AgentDefinition(
    id="bench.recovery",
    allowed_tools=["bench_read", "bench_write"],
    read_only=False,  # bench_write asks for approval; the benchmark approves it at once
    script=[
        ScriptStep(
            text="looking things up and writing " * 2,
            delta_chars=4,
            delta_delay_s=0.05,
            tool_calls=[ScriptToolCall(name="bench_read", args={}), ScriptToolCall(name="bench_write", args={})],
        ),
        ScriptStep(text="all done " * 6, delta_chars=4, delta_delay_s=0.05),
    ],
)
