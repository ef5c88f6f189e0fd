"""Agents and tools for the resolution-chain tests (ids `pol.*`, tools `pol_*`). Offline: a function model
that calls the tools its step is shown, so what a policy hides shows in what the model does.

`pol_wait` holds its step until the test releases it (a BLPOP on a key under the test's prefix, named after
the turn), so a test changes a policy while a turn provably runs, with no timing guesses.
"""

from __future__ import annotations

import contextlib
import time

import redis

from stepq.agents.definition import AgentDefinition, Budget, LoopConfig
from stepq.agents.tools import ToolContext, tool
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptStep, ScriptToolCall

REDIS_URL = "redis://127.0.0.1:6379/0"
_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
GATE_TIMEOUT_S = 120


def gate_key(prefix: str, turn_id: str) -> str:
    """The key `pol_wait` waits on (under the test's key prefix, so the test's cleanup removes it)."""
    return f"{prefix}:gate:{turn_id}"


@tool
def pol_lookup(key: str) -> dict[str, str]:
    """Look a key up."""
    return {"key": key, "value": key.upper()}


@tool(is_mutation=True)
def pol_write(key: str) -> dict[str, str]:
    """Write a key (a mutation: approval-gated under confirm-required)."""
    return {"written": key}


@tool
def pol_wait(ctx: ToolContext) -> dict[str, bool]:
    """Wait until the test releases this turn (short polls: a worker's sockets may time out a long BLPOP)."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    key = gate_key(str(ctx.metadata.get("prefix")), ctx.turn_id)
    while time.monotonic() < deadline and not ctx.cancelled.is_set():
        with contextlib.suppress(redis.TimeoutError):
            if _redis.blpop([key], timeout=1) is not None:
                return {"released": True}
    return {"released": False}


def _answer(request: FunctionRequest) -> FunctionResponse | str:
    """Wait first (when shown), then two lookups, then answer; with no tools shown, answer at once."""
    shown = [t.name for t in request.tools]
    called = [c.name for m in request.messages for c in getattr(m, "tool_calls", [])]
    if not shown:
        return f"no tools on step {request.step}: answering at once"
    if "pol_wait" in shown and "pol_wait" not in called:
        return FunctionResponse(text="waiting", tool_calls=[ScriptToolCall(name="pol_wait", args={})])
    if "pol_lookup" in shown and called.count("pol_lookup") < 2:
        return FunctionResponse(
            text="looking", tool_calls=[ScriptToolCall(name="pol_lookup", args={"key": f"k{request.step}"})]
        )
    return f"done on step {request.step}"


fleet = AgentDefinition(
    id="pol.fleet",
    allowed_tools=["pol_wait", "pol_lookup", "pol_write"],
    read_only=False,
    mutation_policy="confirm-required",
    loop=LoopConfig(max_steps=8, budget=Budget(max_tool_calls=20)),
    function_model=FunctionModel(_answer),
)

plain = AgentDefinition(  # no wait: a turn runs straight through in-process
    id="pol.plain",
    allowed_tools=["pol_lookup", "pol_write"],
    read_only=False,
    mutation_policy="confirm-required",
    loop=LoopConfig(max_steps=6),
    function_model=FunctionModel(_answer),
)

locked = AgentDefinition(
    id="pol.locked",
    allow_runtime_override=False,
    script=[ScriptStep(text="fixed model, fixed loop")],
)

writer = AgentDefinition(  # approval-gated write on step 0, then an answer
    id="pol.writer",
    allowed_tools=["pol_write"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(text="writing", tool_calls=[ScriptToolCall(name="pol_write", args={"key": "a"})]),
        ScriptStep(text="written"),
    ],
)
