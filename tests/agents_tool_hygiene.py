"""Agents and tools for tests/test_tool_hygiene.py: tools that raise with secrets in the message, async
and subprocess tools that outlive their timeout, tools that watch for the turn's cancellation.

Each tool reports what happened to it in Redis under `<prefix>:th:<turn_id>:<what>` (the prefix from
the turn's metadata), so the test waits on those conditions instead of on time.
"""

from __future__ import annotations

import asyncio
import os
import sys

import redis

from stepq import ToolCancelledError
from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

_redis = redis.Redis.from_url(os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)


def mark_key(prefix: str, turn_id: str, what: str) -> str:
    return f"{prefix}:th:{turn_id}:{what}"


def _mark(ctx: ToolContext, what: str, value: object = 1) -> None:
    _redis.rpush(mark_key(str(ctx.metadata["prefix"]), ctx.turn_id, what), str(value))


@tool
def th_leaky(ctx: ToolContext) -> dict[str, object]:
    """Fails with a secret, a password and a multi-line, very long message in its exception."""
    secret = str(ctx.metadata["secret"])
    raise ValueError(f"upstream refused key {secret} (password=hunter2-xyz)\n  detail line\n" + "x" * 5000)


@tool(timeout_s=0.2)
async def th_async_slow(ctx: ToolContext) -> dict[str, object]:
    """Awaits far past its timeout; reports when its task is cancelled."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        _mark(ctx, "async-cancelled")
        raise
    return {"never": True}


@tool(timeout_s=0.2)
def th_process_slow(ctx: ToolContext) -> dict[str, object]:
    """Runs a subprocess (which records its pid) far past the tool's timeout, through ctx.run_process."""
    pid_key = mark_key(str(ctx.metadata["prefix"]), ctx.turn_id, "pid")
    script = (
        f"import os, redis, signal; redis.Redis.from_url({_url()!r}).rpush({pid_key!r}, os.getpid()); signal.pause()"
    )
    try:
        ctx.run_process([sys.executable, "-c", script])
    except ToolCancelledError:
        _mark(ctx, "process-killed")
        raise
    return {"never": True}


def _url() -> str:
    return os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@tool(timeout_s=0.2)
def th_ignores_cancel(name: str, ctx: ToolContext) -> dict[str, object]:
    """Blocks on a gate (a Redis list) and ignores its cancellation flag: a thread that lingers."""
    _mark(ctx, "lingering-started")
    opened = _redis.blpop([mark_key(str(ctx.metadata["prefix"]), ctx.turn_id, f"gate-{name}")], timeout=60)
    return {"opened": opened is not None}


@tool(timeout_s=120)
def th_watch_cancel(ctx: ToolContext) -> dict[str, object]:
    """Works until the turn is cancelled (polling ctx.cancelled), then stops early."""
    _mark(ctx, "watch-started")
    saw = ctx.cancelled.wait(timeout=60)
    _mark(ctx, "watch-saw", saw)
    return {"saw_cancel": saw}


@tool(timeout_s=120)
async def th_async_watch(ctx: ToolContext) -> dict[str, object]:
    """An async tool awaiting until its task is cancelled by the turn's cancellation."""
    _mark(ctx, "async-watch-started")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        _mark(ctx, "async-watch-cancelled")
        raise
    return {"slept": True}


class _Unprintable:
    """An object that cannot be turned into text: its __str__ and __repr__ raise."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this object")

    def __repr__(self) -> str:
        raise RuntimeError("no repr for this object")


class UnprintableError(Exception):
    """An exception whose message cannot be read: describing it must not fail the step."""

    def __str__(self) -> str:
        raise RuntimeError("no message for this exception")


@tool
def th_cycle() -> dict[str, object]:
    """Returns a dict that contains itself."""
    result: dict[str, object] = {"name": "loop"}
    result["self"] = result
    return result


@tool
def th_unprintable() -> dict[str, object]:
    """Returns an object JSON cannot carry and whose str()/repr() raise."""
    return {"value": _Unprintable()}


@tool
def th_raises_unprintable() -> dict[str, object]:
    """Raises an exception whose __str__ raises."""
    raise UnprintableError()


HUGE_CHARS = 50 * 1024 * 1024


@tool
def th_huge() -> str:
    """Returns a 50 MB string."""
    return "x" * HUGE_CHARS


def _agent(agent_name: str, tool_name: str, calls: int = 1, **args: object) -> AgentDefinition:
    return AgentDefinition(
        id=f"th.{agent_name}",
        allowed_tools=[tool_name],
        script=[
            ScriptStep(
                text="working",
                tool_calls=[ScriptToolCall(id=f"c{i}", name=tool_name, args=dict(args)) for i in range(calls)],
            ),
            ScriptStep(text="done"),
        ],
    )


leaky = _agent("leaky", "th_leaky")
async_slow = _agent("async_slow", "th_async_slow")
process_slow = _agent("process_slow", "th_process_slow")
lingering = _agent("lingering", "th_ignores_cancel", calls=2, name="g")
watch_cancel = _agent("watch_cancel", "th_watch_cancel")
async_watch = _agent("async_watch", "th_async_watch")
cycle = _agent("cycle", "th_cycle")
unprintable = _agent("unprintable", "th_unprintable")
raises_unprintable = _agent("raises_unprintable", "th_raises_unprintable")
huge = _agent("huge", "th_huge")
