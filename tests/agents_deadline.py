"""Agents for tests/test_step_deadline.py: a step that would run far past its turn's wall-clock budget.

Each streams or waits for up to ~30 s, far longer than the 1 s budget the tests give their turns, so a turn
that ends with a short text (or a tool told to stop) shows the deadline cut the step; without it the step
would run to its end. Tools report in Redis under `<prefix>:dl:<turn_id>:<what>`.
"""

from __future__ import annotations

import os

import redis
from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptToolCall

_redis = redis.Redis.from_url(os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)

LONG_TEXT = "word " * 2000  # 625 deltas of 16 characters
DELTA_DELAY_S = 0.05  # ~30 s for the whole text


def mark_key(prefix: str, turn_id: str, what: str) -> str:
    return f"{prefix}:dl:{turn_id}:{what}"


@tool(timeout_s=120)
def dl_wait(ctx: ToolContext) -> str:
    """Works for up to 30 s unless told to stop; says which."""
    stopped = ctx.cancelled.wait(timeout=30)
    _redis.rpush(mark_key(str(ctx.metadata["prefix"]), ctx.turn_id, "stopped"), int(stopped))
    return "stopped early" if stopped else "worked to the end"


@tool
def dl_never(ctx: ToolContext) -> str:
    """Called after dl_wait in the same step: must not start once the deadline passed."""
    _redis.rpush(mark_key(str(ctx.metadata["prefix"]), ctx.turn_id, "never-ran"), 1)
    return "ran"


def _long_stream(_request: FunctionRequest) -> FunctionResponse:
    return FunctionResponse(text=LONG_TEXT, delta_delay_s=DELTA_DELAY_S)


def _slow_tools(request: FunctionRequest) -> FunctionResponse:
    if request.tool_results:
        return FunctionResponse(text="after the tools")
    calls = [ScriptToolCall(id="wait", name="dl_wait", args={}), ScriptToolCall(id="never", name="dl_never", args={})]
    return FunctionResponse(tool_calls=calls)


class Summary(BaseModel):
    title: str


def _object_after_long_stream(request: FunctionRequest) -> FunctionResponse:
    if request.answer_now:
        return FunctionResponse(object={"title": "answered at the deadline"})
    return FunctionResponse(text=LONG_TEXT, delta_delay_s=DELTA_DELAY_S)


long_stream = AgentDefinition(id="dl.long_stream", function_model=FunctionModel(_long_stream))
slow_tools = AgentDefinition(
    id="dl.slow_tools", allowed_tools=["dl_wait", "dl_never"], function_model=FunctionModel(_slow_tools)
)
object_stream = AgentDefinition(
    id="dl.object_stream",
    execution_mode="object",
    output=Summary,
    allowed_tools=["dl_never"],  # with a tool to offer, its first step is not yet the answer step
    function_model=FunctionModel(_object_after_long_stream),
)
