"""Agents and tools for the thread tests. Their scripts move with the conversation (`script_by`), and each
answer starts with the transcript the model was sent (`echo_messages`), so a test reads what it received."""

from __future__ import annotations

import redis

from stepq.agents.definition import AgentDefinition, Budget, LoopConfig
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

REDIS_URL = "redis://127.0.0.1:6379/0"
_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
GATE_TIMEOUT_S = 60


def gate_entered(prefix: str) -> str:
    return f"{prefix}:thr-gate:entered"


def gate_open(prefix: str) -> str:
    return f"{prefix}:thr-gate:open"


@tool
def thr_weather(city: str) -> dict[str, str]:
    """The weather in a city."""
    return {"city": city, "weather": "sunny"}


@tool
def thr_gate(ctx: ToolContext) -> dict[str, bool]:
    """Say it has started, then wait until the test opens the gate: holds a turn mid-tool-cycle."""
    prefix = ctx.metadata["prefix"]
    _redis.rpush(gate_entered(prefix), ctx.turn_id)
    opened = _redis.blpop([gate_open(prefix)], timeout=GATE_TIMEOUT_S)
    return {"opened": opened is not None}


_CONVERSATION = {"script_by": "conversation"}

chat = AgentDefinition(
    id="thr.chat",
    allowed_tools=["thr_weather"],
    provider_options=_CONVERSATION,
    script=[
        ScriptStep(text="nice to meet you", echo_messages=True),
        ScriptStep(
            text="let me look",
            echo_messages=True,
            tool_calls=[ScriptToolCall(name="thr_weather", args={"city": "Oslo"})],
        ),
        ScriptStep(text="it is sunny in Oslo", echo_messages=True),
        ScriptStep(text="you asked about Oslo", echo_messages=True),
    ],
)

gated = AgentDefinition(
    id="thr.gated",
    allowed_tools=["thr_gate"],
    provider_options=_CONVERSATION,
    script=[
        ScriptStep(text="waiting at the gate", tool_calls=[ScriptToolCall(name="thr_gate")]),
        ScriptStep(text="through the gate", echo_messages=True),
        ScriptStep(text="next answer", echo_messages=True),
    ],
)

over_budget = AgentDefinition(
    id="thr.over_budget",
    allowed_tools=["thr_weather"],
    provider_options=_CONVERSATION,
    loop=LoopConfig(budget=Budget(max_tool_calls=1)),
    script=[
        ScriptStep(
            text="two lookups",
            tool_calls=[
                ScriptToolCall(name="thr_weather", args={"city": "Oslo"}),
                ScriptToolCall(name="thr_weather", args={"city": "Rome"}),
            ],
        ),
        ScriptStep(text="after the budget", echo_messages=True),
    ],
)
