"""Agents and tools for the definition / policy / engine / submit / event tests (scripted provider).

Every `eng_*` tool that matters for side effects counts its executions in Redis under
`<prefix>:eng-calls:<turn_id>:<tool>`, with the prefix taken from the turn's metadata,
so a test can assert that a tool ran exactly N times (or never).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from pydantic import BaseModel, Field

from stepq.agents.definition import AgentDefinition, Budget, LoopConfig, StopWhen
from stepq.agents.tools import ToolContext, tool
from stepq.engine.runner import StepRunner
from stepq.fleet.runtime import Runtime
from stepq.models import ToolResult, ToolResultMessage, TurnState, TurnStatus
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall
from stepq.store.keys import Keys
from stepq.turns.submit import create_turn

_redis = redis.Redis.from_url(os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)


def calls_key(prefix: str, turn_id: str, tool_name: str) -> str:
    return f"{prefix}:eng-calls:{turn_id}:{tool_name}"


def gate_key(prefix: str, name: str) -> str:
    return f"{prefix}:eng-gate:{name}"


def _record(ctx: ToolContext, tool_name: str) -> int:
    return int(_redis.incr(calls_key(str(ctx.metadata["prefix"]), ctx.turn_id, tool_name)))


# --------------------------------------------------------------------------- tools


@tool
def eng_echo(text: str) -> dict[str, str]:
    """Echo the text back."""
    return {"echo": text}


@tool
def eng_count(label: str, ctx: ToolContext) -> dict[str, object]:
    """Count one execution (read-only tool)."""
    return {"label": label, "count": _record(ctx, "eng_count")}


@tool
def eng_hidden(text: str, ctx: ToolContext) -> dict[str, object]:
    """Registered but never whitelisted: must never run."""
    return {"text": text, "count": _record(ctx, "eng_hidden")}


@tool(is_mutation=True)
def eng_write(label: str, ctx: ToolContext) -> dict[str, object]:
    """A mutation tool."""
    return {"label": label, "count": _record(ctx, "eng_write")}


@tool(destructive=True)
def eng_wipe(label: str, ctx: ToolContext) -> dict[str, object]:
    """A destructive tool that is not flagged as a mutation."""
    return {"label": label, "count": _record(ctx, "eng_wipe")}


@tool(needs_approval=lambda args: args["amount"] > 100)
def eng_pay(amount: float, ctx: ToolContext) -> dict[str, object]:
    """Pay an amount; amounts above 100 need a reviewer."""
    return {"amount": amount, "count": _record(ctx, "eng_pay")}


@tool
def eng_lookup(order_id: str, ctx: ToolContext, limit: int = 5, note: str | None = None) -> dict[str, object]:
    """Look up an order (schema derived from type hints)."""
    return {"order_id": order_id, "limit": limit, "note": note, "count": _record(ctx, "eng_lookup")}


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, description="what to search for")
    limit: int = Field(default=5, ge=1, le=50, description="how many hits")


@tool(args_model=SearchArgs)
def eng_search(query: str, limit: int, ctx: ToolContext) -> dict[str, object]:
    """Search (schema from a pydantic model)."""
    return {"query": query, "limit": limit, "count": _record(ctx, "eng_search")}


@tool
def eng_boom(label: str, ctx: ToolContext) -> dict[str, object]:
    """Always raises after counting the execution."""
    _record(ctx, "eng_boom")
    raise RuntimeError(f"boom: {label}")


@tool
def eng_big(size: int) -> str:
    """Return a string of `size` characters (for truncation)."""
    return "y" * size


@tool
def eng_gate(name: str, ctx: ToolContext) -> dict[str, object]:
    """Block until the test opens the gate (a Redis list push), at most 30 s."""
    opened = _redis.blpop([gate_key(str(ctx.metadata["prefix"]), name)], timeout=30)
    return {"gate": name, "opened": opened is not None}


@tool(timeout_s=0.2)
def eng_stuck(name: str, ctx: ToolContext) -> dict[str, object]:
    """Block on a gate far longer than its 0.2 s timeout (the test opens the gate to free the thread)."""
    opened = _redis.blpop([gate_key(str(ctx.metadata["prefix"]), name)], timeout=30)
    return {"gate": name, "opened": opened is not None}


@tool
def eng_context(ctx: ToolContext) -> dict[str, object]:
    """Report what the tool context carries."""
    return {
        "turn_id": ctx.turn_id,
        "tool_call_id": ctx.tool_call_id,
        "idempotency_key": ctx.idempotency_key,
        "metadata": dict(ctx.metadata),
        "logger": ctx.logger.name,
    }


def _call(tool_name: str, id: str | None = None, **args: object) -> ScriptToolCall:
    return ScriptToolCall(name=tool_name, args=args, id=id)


# --------------------------------------------------------------------------- definitions and policy

whitelist = AgentDefinition(
    id="eng.whitelist",
    allowed_tools=["eng_echo"],
    script=[
        ScriptStep(echo_tools=True, tool_calls=[_call("eng_hidden", text="sneak"), _call("eng_echo", text="hi")]),
        ScriptStep(echo_tools=True, text="done"),
    ],
)

_WRITE_TOOLS = ["eng_echo", "eng_write", "eng_wipe"]
_WRITE_SCRIPT = [
    ScriptStep(
        echo_tools=True,
        tool_calls=[_call("eng_write", label="w"), _call("eng_wipe", label="d"), _call("eng_echo", text="e")],
    ),
    ScriptStep(echo_tools=True, text="done"),
]

read_only_default = AgentDefinition(id="eng.read_only_default", allowed_tools=_WRITE_TOOLS, script=_WRITE_SCRIPT)

policy_read_only = AgentDefinition(
    id="eng.policy_read_only",
    allowed_tools=_WRITE_TOOLS,
    read_only=False,
    mutation_policy="read-only",
    script=_WRITE_SCRIPT,
)

confirm = AgentDefinition(
    id="eng.confirm",
    allowed_tools=_WRITE_TOOLS,
    read_only=False,
    mutation_policy="confirm-required",
    script=_WRITE_SCRIPT,
)

destructive_confirm = AgentDefinition(
    id="eng.destructive_confirm",
    allowed_tools=_WRITE_TOOLS,
    read_only=False,
    mutation_policy="destructive-confirm-required",
    script=_WRITE_SCRIPT,
)

predicate = AgentDefinition(
    id="eng.predicate",
    allowed_tools=["eng_pay"],
    script=[
        ScriptStep(tool_calls=[_call("eng_pay", id="small", amount=50), _call("eng_pay", id="large", amount=500)]),
        ScriptStep(text="done"),
    ],
)

schemas = AgentDefinition(
    id="eng.schemas",
    allowed_tools=["eng_lookup", "eng_search"],
    script=[
        ScriptStep(
            echo_tools=True,
            tool_calls=[
                _call("eng_lookup", id="lk", order_id="A-1", limit="7"),
                _call("eng_search", id="s_ok", query="mugs"),
                _call("eng_search", id="s_bad", query="", limit=99),
            ],
        ),
        ScriptStep(text="done"),
    ],
)

features = AgentDefinition(
    id="eng.features",
    required_features=["beta", "export"],
    script=[ScriptStep(text="ok")],
)

# --------------------------------------------------------------------------- loop limits

loop = AgentDefinition(
    id="eng.loop",
    allowed_tools=["eng_count"],
    loop=LoopConfig(max_steps=4, budget=Budget(max_tool_calls=10, max_tokens=10_000, max_wall_clock_s=600)),
    script=[ScriptStep(text="again", tool_calls=[_call("eng_count", label="loop")], input_tokens=10, output_tokens=10)],
)

stop_steps = AgentDefinition(
    id="eng.stop_steps",
    allowed_tools=["eng_count"],
    loop=LoopConfig(max_steps=6, stop_when=[StopWhen(step_count=2)]),
    script=[ScriptStep(text="again", tool_calls=[_call("eng_count", label="loop")])],
)

stop_tool = AgentDefinition(
    id="eng.stop_tool",
    allowed_tools=["eng_count", "eng_echo"],
    loop=LoopConfig(max_steps=6, stop_when=[StopWhen(has_tool_call="eng_echo")]),
    script=[
        ScriptStep(text="count", tool_calls=[_call("eng_count", label="loop")]),
        ScriptStep(text="count", tool_calls=[_call("eng_count", label="loop")]),
        ScriptStep(text="echo", tool_calls=[_call("eng_echo", text="stop here")]),
        ScriptStep(text="never reached"),
    ],
)

budget_tools = AgentDefinition(
    id="eng.budget_tools",
    allowed_tools=["eng_count"],
    loop=LoopConfig(max_steps=10, budget=Budget(max_tool_calls=2)),
    script=[ScriptStep(text="again", tool_calls=[_call("eng_count", label="loop")])],
)

budget_tokens = AgentDefinition(
    id="eng.budget_tokens",
    allowed_tools=["eng_count"],
    loop=LoopConfig(max_steps=10, budget=Budget(max_tokens=30)),
    script=[ScriptStep(text="again", tool_calls=[_call("eng_count", label="loop")], input_tokens=10, output_tokens=10)],
)

budget_clock = AgentDefinition(
    id="eng.budget_clock",
    allowed_tools=["eng_count"],
    loop=LoopConfig(max_steps=10, budget=Budget(max_wall_clock_s=60)),
    script=[ScriptStep(text="again", tool_calls=[_call("eng_count", label="loop")])],
)

# --------------------------------------------------------------------------- object mode


class Person(BaseModel):
    name: str
    age: int = Field(ge=0)


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

_VALID = {"name": "Ada", "age": 36}
_MISSING_AGE = {"name": "Ada"}
_BAD_AGE = {"name": "Ada", "age": -3}

object_model_ok = AgentDefinition(
    id="eng.object_model_ok", execution_mode="object", output=Person, script=[ScriptStep(object=_VALID)]
)
object_model_repair = AgentDefinition(
    id="eng.object_model_repair",
    execution_mode="object",
    output=Person,
    script=[ScriptStep(object=_MISSING_AGE), ScriptStep(object=_VALID)],
)
object_model_bad = AgentDefinition(
    id="eng.object_model_bad",
    execution_mode="object",
    output=Person,
    script=[ScriptStep(object=_MISSING_AGE), ScriptStep(object=_BAD_AGE)],
)
object_schema_ok = AgentDefinition(
    id="eng.object_schema_ok", execution_mode="object", output=PERSON_SCHEMA, script=[ScriptStep(object=_VALID)]
)
object_schema_repair = AgentDefinition(
    id="eng.object_schema_repair",
    execution_mode="object",
    output=PERSON_SCHEMA,
    script=[ScriptStep(object=_MISSING_AGE), ScriptStep(object=_VALID)],
)
object_schema_bad = AgentDefinition(
    id="eng.object_schema_bad",
    execution_mode="object",
    output=PERSON_SCHEMA,
    script=[ScriptStep(object=_MISSING_AGE), ScriptStep(object=_BAD_AGE)],
)
object_not_json = AgentDefinition(
    id="eng.object_not_json",
    execution_mode="object",
    output=Person,
    script=[ScriptStep(text="Sure! Ada is 36."), ScriptStep(object=_VALID)],
)

object_capped = AgentDefinition(
    id="eng.object_capped",
    execution_mode="object",
    output=Person,
    allowed_tools=["eng_echo"],
    loop=LoopConfig(max_steps=2),
    script=[ScriptStep(tool_calls=[_call("eng_echo", text="more")])],
)

# --------------------------------------------------------------------------- tool dispatch

bad_args = AgentDefinition(
    id="eng.bad_args",
    allowed_tools=["eng_count"],
    script=[
        ScriptStep(
            tool_calls=[
                _call("eng_count", id="missing"),
                _call("eng_count", id="extra", label="x", surprise=1),
                _call("eng_count", id="wrong_type", label=["not", "a", "string"]),
                _call("eng_count", id="good", label="ok"),
            ]
        ),
        ScriptStep(text="done"),
    ],
)

unknown_tool = AgentDefinition(
    id="eng.unknown_tool",
    allowed_tools=["eng_echo"],
    script=[ScriptStep(tool_calls=[_call("eng_nonexistent", id="u", x=1)]), ScriptStep(text="done")],
)

unknown_tool_breaker = AgentDefinition(
    id="eng.unknown_tool_breaker",
    allowed_tools=["eng_echo"],
    tool_failure_breaker=2,
    script=[
        ScriptStep(tool_calls=[_call("eng_nonexistent", x=1)]),
        ScriptStep(tool_calls=[_call("eng_nonexistent", x=1)]),
        ScriptStep(tool_calls=[_call("eng_nonexistent", x=1)]),
        ScriptStep(text="done"),
    ],
)

raising = AgentDefinition(
    id="eng.raising",
    allowed_tools=["eng_boom"],
    script=[ScriptStep(tool_calls=[_call("eng_boom", id="b", label="x")]), ScriptStep(text="recovered")],
)

_BOOM_STEPS = [ScriptStep(tool_calls=[_call("eng_boom", label="x")]) for _ in range(4)] + [ScriptStep(text="done")]

breaker = AgentDefinition(id="eng.breaker", allowed_tools=["eng_boom"], tool_failure_breaker=2, script=_BOOM_STEPS)

no_breaker = AgentDefinition(id="eng.no_breaker", allowed_tools=["eng_boom"], script=_BOOM_STEPS)

breaker_one_step = AgentDefinition(
    id="eng.breaker_one_step",
    allowed_tools=["eng_boom"],
    tool_failure_breaker=2,
    script=[
        ScriptStep(tool_calls=[_call("eng_boom", id=f"b{i}", label=str(i)) for i in range(3)]),
        ScriptStep(text="done"),
    ],
)

usage_trace = AgentDefinition(
    id="eng.usage_trace",
    allowed_tools=["eng_echo"],
    script=[
        ScriptStep(
            text="first",
            tool_calls=[_call("eng_echo", text="a")],
            input_tokens=11,
            output_tokens=7,
            fail=ScriptFailure(when="before", status=429, retry_after_s=0.0),
        ),
        ScriptStep(text="second", tool_calls=[_call("eng_echo", text="b")], input_tokens=13, output_tokens=5),
        ScriptStep(text="the end", input_tokens=17, output_tokens=3, delta_chars=2, delta_delay_s=0.01),
    ],
)

stuck = AgentDefinition(
    id="eng.stuck",
    allowed_tools=["eng_stuck"],
    script=[ScriptStep(tool_calls=[_call("eng_stuck", id="s", name="t")]), ScriptStep(text="went on")],
)

context = AgentDefinition(
    id="eng.context",
    allowed_tools=["eng_context"],
    script=[ScriptStep(tool_calls=[_call("eng_context", id="ctx1")]), ScriptStep(text="done")],
)

rerun = AgentDefinition(
    id="eng.rerun",
    allowed_tools=["eng_count"],
    script=[ScriptStep(tool_calls=[_call("eng_count", id="call_fixed", label="once")]), ScriptStep(text="done")],
)


@tool
def eng_await_checkpoint(ctx: ToolContext) -> dict[str, bool]:
    """Read-only and slower than the flush window: wait (at most 10 s) for the step's checkpoint to be stored."""
    key = Keys(str(ctx.metadata["prefix"])).checkpoint(ctx.turn_id)
    deadline = time.monotonic() + 10
    while not _redis.exists(key):
        if time.monotonic() > deadline:
            return {"checkpoint": False}
        time.sleep(0.005)  # polling Redis for the key (nothing to wait on); bounded by the deadline
    return {"checkpoint": True}


slow_read = AgentDefinition(
    id="eng.slow_read",
    allowed_tools=["eng_await_checkpoint"],
    script=[ScriptStep(tool_calls=[_call("eng_await_checkpoint", id="w")]), ScriptStep(text="done")],
)

big_result = AgentDefinition(
    id="eng.big_result",
    allowed_tools=["eng_big"],
    script=[ScriptStep(tool_calls=[_call("eng_big", id="big", size=50_000)]), ScriptStep(text="done")],
)

# --------------------------------------------------------------------------- streaming

slow = AgentDefinition(
    id="eng.slow",
    script=[ScriptStep(text="x" * 2000, delta_chars=2, delta_delay_s=0.02)],  # 1000 deltas, ~20 s if never stopped
)

gated = AgentDefinition(
    id="eng.gated",
    allowed_tools=["eng_gate"],
    script=[
        ScriptStep(text="before the gate opens", delta_chars=3, tool_calls=[_call("eng_gate", name="g")]),
        ScriptStep(text="after the gate opened, the rest of the answer", delta_chars=3),
    ],
)

CHATTY_TEXT = "".join(f"{i:03d}" for i in range(100))  # 300 chars

chatty = AgentDefinition(
    id="eng.chatty",
    script=[ScriptStep(text=CHATTY_TEXT, delta_chars=3, delta_delay_s=0.001)],  # 100 deltas
)

simple = AgentDefinition(
    id="eng.simple",
    allowed_tools=["eng_echo"],
    script=[ScriptStep(text="calling", tool_calls=[_call("eng_echo", text="x")]), ScriptStep(text="all done")],
)


# --------------------------------------------------------------------------- helpers for the tests


def executions(prefix: str, turn_id: str, tool_name: str) -> int:
    """How many times `tool_name` really ran in this turn."""
    value = _redis.get(calls_key(prefix, turn_id, tool_name))
    return int(value) if value else 0


def stored_keys(prefix: str) -> list[str]:
    """Every Redis key under the test's prefix (turn state, events, broker queues...)."""
    return sorted(_redis.scan_iter(match=f"{prefix}*", count=1000))


def drive(rt: Runtime, turn_id: str, max_deliveries: int = 50) -> TurnState:
    """Run a turn in-process, delivery after delivery, until the engine says stop; returns the stored state."""
    runner = StepRunner(rt)
    step = 0
    for _ in range(max_deliveries):
        decision = runner.deliver(turn_id, step)
        if decision.action == "none":
            state = rt.turns.load(turn_id)
            if state is None or state.status.terminal or state.status.parked or state.status == TurnStatus.QUEUED:
                break
            # Still running after its delivery ended: on a loaded machine the step's lease expired while it ran
            # (the heartbeat thread starved), so its commit was refused. Run it again once the lease is gone,
            # as the sweeper would.
            lease, deadline = rt.keys.lease(turn_id), time.monotonic() + 60
            while rt.redis.exists(lease):  # a lease's TTL is seconds; polled, not slept through
                assert time.monotonic() < deadline, f"turn {turn_id}'s lost lease never expired"
                time.sleep(0.05)
            step = state.step
            continue
        assert decision.action in ("next", "retry"), decision
        assert decision.countdown == 0, "scripts used in-process retry with retry_after_s=0"
        step = decision.step
    else:
        raise AssertionError(f"turn {turn_id} did not stop within {max_deliveries} deliveries")
    state = rt.turns.load(turn_id)
    assert state is not None
    return state


def start(rt: Runtime, agent_id: str, prefix: str, **kwargs: Any) -> str:
    """Store a turn for `agent_id` (prompt 'go' unless given) and return its id."""
    kwargs.setdefault("prompt", "go")
    state, created = create_turn(rt, agent_id, metadata={"prefix": prefix}, **kwargs)
    assert created
    return state.turn_id


def tool_results(state: TurnState) -> dict[str, ToolResult]:
    """Every tool result in the transcript, by tool call id."""
    return {r.tool_call_id: r for m in state.messages if isinstance(m, ToolResultMessage) for r in m.results}
