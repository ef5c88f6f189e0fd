"""Agents and tools for the runtime tests (scripted provider)."""

from __future__ import annotations

import redis

from stepq.agents.definition import AgentDefinition, Budget, LoopConfig, StopWhen
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall
from stepq.store.keys import Keys

REDIS_URL = "redis://127.0.0.1:6379/0"
_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)


@tool
def rt_echo(text: str) -> dict[str, str]:
    """Echo the text back."""
    return {"echo": text}


@tool(is_mutation=True)
def rt_side_effect(label: str, ctx: ToolContext) -> dict[str, object]:
    """Record one side effect in Redis (counts executions per turn)."""
    count = _redis.incr(f"{ctx.metadata['prefix']}:side-effects:{ctx.turn_id}:{label}")
    return {"label": label, "count": count}


@tool
def rt_marker_side_effect(label: str, ctx: ToolContext) -> dict[str, object]:
    """A non-mutation tool with a side effect (counts executions per turn)."""
    count = _redis.incr(f"{ctx.metadata['prefix']}:side-effects:{ctx.turn_id}:{label}")
    return {"label": label, "count": count}


basic = AgentDefinition(
    id="rt.basic",
    system_prompt="test",
    allowed_tools=["rt_echo"],
    script=[
        ScriptStep(text="calling echo", tool_calls=[ScriptToolCall(name="rt_echo", args={"text": "hi"})]),
        ScriptStep(text="all done here, thanks"),
    ],
)

slow_stream = AgentDefinition(
    id="rt.slow_stream",
    allowed_tools=["rt_marker_side_effect"],
    script=[
        ScriptStep(
            text="side effect first",
            tool_calls=[ScriptToolCall(name="rt_marker_side_effect", args={"label": "once"})],
        ),
        ScriptStep(text="x" * 40, delta_chars=2, delta_delay_s=0.15),  # ~3 s of streaming
        ScriptStep(text="finished"),
    ],
)

rate_limited = AgentDefinition(
    id="rt.rate_limited",
    script=[ScriptStep(text="ok after retry", fail=ScriptFailure(when="before", status=429, retry_after_s=1.0))],
)

in_stream_error = AgentDefinition(
    id="rt.in_stream_error",
    script=[
        ScriptStep(
            text="ok after in-stream error",
            fail=ScriptFailure(when="in-stream", status=None, code="overloaded_error", message="Overloaded"),
        )
    ],
)

error_after_content = AgentDefinition(
    id="rt.error_after_content",
    script=[
        ScriptStep(
            text="partial answer that breaks",
            fail=ScriptFailure(when="after-content", status=529, message="overloaded mid-stream"),
        )
    ],
)

always_failing = AgentDefinition(
    id="rt.always_failing",
    script=[ScriptStep(text="never", fail=ScriptFailure(when="before", status=503, times=100, message="unavailable"))],
)

looping = AgentDefinition(
    id="rt.looping",
    allowed_tools=["rt_echo"],
    loop=LoopConfig(max_steps=3, budget=Budget(max_tool_calls=10)),
    script=[ScriptStep(text="again", tool_calls=[ScriptToolCall(name="rt_echo", args={"text": "x"})])],
)

stop_on_tool = AgentDefinition(
    id="rt.stop_on_tool",
    allowed_tools=["rt_echo"],
    loop=LoopConfig(max_steps=5, stop_when=[StopWhen(has_tool_call="rt_echo")]),
    script=[ScriptStep(text="one", tool_calls=[ScriptToolCall(name="rt_echo", args={"text": "x"})])],
)

reset_on_error = AgentDefinition(
    id="rt.reset_on_error",
    retry_after_emission=True,
    script=[
        ScriptStep(
            text="partial answer that breaks",
            fail=ScriptFailure(when="after-content", status=503, message="dropped mid-stream"),
        )
    ],
)

approver = AgentDefinition(
    id="rt.approver",
    allowed_tools=["rt_echo", "rt_side_effect"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(
            text="echo, then write",
            tool_calls=[
                ScriptToolCall(name="rt_echo", args={"text": "now"}),
                ScriptToolCall(name="rt_side_effect", args={"label": "gated"}),
            ],
        ),
        ScriptStep(text="done"),
    ],
)

one_call_gated = AgentDefinition(
    id="rt.one_call_gated",
    allowed_tools=["rt_echo", "rt_side_effect"],
    read_only=False,
    mutation_policy="confirm-required",
    parallel_tool_calls=False,  # the scripted provider sends both calls anyway: only the first may run
    script=[
        ScriptStep(
            text="write, then echo",
            tool_calls=[
                ScriptToolCall(name="rt_side_effect", args={"label": "gated"}),
                ScriptToolCall(name="rt_echo", args={"text": "must not run"}),
            ],
        ),
        ScriptStep(text="done"),
    ],
)

approver_two = AgentDefinition(
    id="rt.approver_two",
    allowed_tools=["rt_side_effect"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(
            tool_calls=[
                ScriptToolCall(name="rt_side_effect", args={"label": "a"}),
                ScriptToolCall(name="rt_side_effect", args={"label": "b"}),
            ],
        ),
        ScriptStep(text="done"),
    ],
)

approver_expiring = AgentDefinition(
    id="rt.approver_expiring",
    allowed_tools=["rt_side_effect"],
    read_only=False,
    approval_ttl_s=0.001,
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="rt_side_effect", args={"label": "late"})]),
        ScriptStep(text="done"),
    ],
)


@tool
def rt_slow_work(seconds: float) -> dict[str, float]:
    """Simulated slow work (a long-running tool)."""
    import time

    time.sleep(seconds)
    return {"slept": seconds}


@tool(needs_approval=True)
def rt_count_stored_results(ctx: ToolContext) -> dict[str, int]:
    """Read-only, approval-gated: how many of the turn's tool results are stored when it starts."""
    keys = Keys(ctx.metadata["prefix"])
    return {"stored": int(_redis.hlen(keys.tool_results(ctx.turn_id)))}


mutation_then_observer = AgentDefinition(
    id="rt.mutation_then_observer",
    allowed_tools=["rt_side_effect", "rt_count_stored_results"],
    read_only=False,
    script=[
        ScriptStep(
            tool_calls=[
                ScriptToolCall(name="rt_side_effect", args={"label": "stored-at-once"}),
                ScriptToolCall(name="rt_count_stored_results", args={}),
            ]
        ),
        ScriptStep(text="done"),
    ],
)


side_effect_then_slow = AgentDefinition(
    id="rt.side_effect_then_slow",
    allowed_tools=["rt_marker_side_effect", "rt_slow_work"],
    script=[
        ScriptStep(
            text="doing two things",
            tool_calls=[
                ScriptToolCall(name="rt_marker_side_effect", args={"label": "mid-tools"}),
                ScriptToolCall(name="rt_slow_work", args={"seconds": 3.0}),
            ],
            fresh_call_ids=True,  # like a real model: asking again would give new ids
        ),
        ScriptStep(text="both done"),
    ],
)
