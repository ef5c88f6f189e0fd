"""Agents for the tracing and lifecycle-hook tests (tests/test_otel_traces.py, tests/test_hooks.py).

`otel_t.flaky` runs on a model that answers 429 then 503 on its primary (a retry, then a failover) and a
backup that calls an approval-gated tool, then answers. `otel_t.held` holds its second step's tool until its
worker is killed. The hooks record each call: into Redis under the worker's key prefix when the worker is a
subprocess (STEPQ_KEY_PREFIX is set there), or into `RECORDED` in this process."""

from __future__ import annotations

import json
import os
from typing import Any

import redis

from stepq.agents.definition import AgentDefinition
from stepq.agents.hooks import ModelRequested, StepFinished, StepStarted, ToolResulted, fails_turn
from stepq.agents.step_control import StepContext, StepOverrides
from stepq.agents.tools import ToolContext, tool
from stepq.models import (
    AssistantMessage,
    Delta,
    FinishReason,
    StepOutput,
    TextPart,
    ToolCall,
    TurnResult,
    Usage,
    UserMessage,
)
from stepq.providers.base import Emit, ProviderAdapter, ProviderError, ShouldStop, StepRequest
from stepq.providers.function import FunctionModel, FunctionRequest
from stepq.providers.registry import register_provider
from stepq.providers.scripted import ScriptStep, ScriptToolCall

_redis = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)
RECORDED: list[tuple[str, Any]] = []  # (hook, info) of hooks run in this process (in-process workers)


def hooks_key(prefix: str) -> str:
    return f"{prefix}:test-hooks"


def _record(hook: str, summary: dict[str, Any], info: Any) -> None:
    prefix = os.environ.get("STEPQ_KEY_PREFIX")
    if prefix:  # a worker subprocess: the test reads what ran where from Redis
        _redis.rpush(hooks_key(prefix), json.dumps({"hook": hook, "pid": os.getpid(), **summary}))
    else:
        RECORDED.append((hook, info))


def on_step_start(info: StepStarted) -> None:
    _record("on_step_start", {"turn": info.turn_id, "step": info.step, "rerun": info.rerun}, info)


def on_model_request(info: ModelRequested) -> None:
    _record("on_model_request", {"turn": info.turn_id, "step": info.step, "system": info.request.system}, info)


def on_tool_result(info: ToolResulted) -> None:
    summary = {"turn": info.turn_id, "step": info.step, "call": info.call.id, "duration": info.duration_s}
    _record("on_tool_result", summary, info)


def on_step_finish(info: StepFinished) -> None:
    _record("on_step_finish", {"turn": info.turn_id, "step": info.step, "duration": info.duration_s}, info)


async def on_turn_finish(result: TurnResult) -> None:  # an async hook: run to its end on the worker
    _record("on_turn_finish", {"turn": result.turn_id, "status": result.status.value}, result)


HOOKS: dict[str, Any] = {
    "on_step_start": on_step_start,
    "on_model_request": on_model_request,
    "on_tool_result": on_tool_result,
    "on_step_finish": on_step_finish,
    "on_turn_finish": on_turn_finish,
}


@tool
def otel_quick(key: str) -> dict[str, str]:
    """Look a key up."""
    return {"key": key, "value": key.upper()}


@tool(is_mutation=True)
def otel_write(label: str) -> dict[str, str]:
    """Write a label (a mutation: it waits for a person's approval)."""
    return {"written": label}


def held_runs_key(prefix: str, turn_id: str) -> str:
    return f"{prefix}:otel-held:{turn_id}"


@tool(timeout_s=None)
def otel_hold(ctx: ToolContext) -> dict[str, Any]:
    """Holds on its first run (until its worker is killed); later runs answer at once. Records its pid."""
    key = held_runs_key(ctx.metadata["prefix"], ctx.turn_id)
    run = _redis.rpush(key, os.getpid())
    if run == 1:
        ctx.cancelled.wait(timeout=180)
    return {"run": run}


class _FlakyAdapter(ProviderAdapter):
    """`primary`: 429 on attempt 0, then 503 (so the step retries once, then fails over). `backup`: calls
    `otel_write` on step 0, then answers."""

    name = "otel-flaky"

    def __init__(self, model: str) -> None:
        self.model = model

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        if self.model == "primary":
            status = 429 if request.attempt == 0 else 503
            raise ProviderError("rate limited" if status == 429 else "unavailable", retryable=True, status=status)
        usage = Usage(input_tokens=11 + request.step, output_tokens=3, cache_read_tokens=2)
        if request.step == 0:
            emit(Delta("text", "writing"))
            call = ToolCall(id="call_write", name="otel_write", args={"label": "x"})
            message = AssistantMessage(parts=[TextPart(text="writing"), call])
            return StepOutput(message=message, usage=usage, finish_reason=FinishReason.TOOL_CALLS)
        emit(Delta("text", "written"))
        return StepOutput(message=AssistantMessage(parts=[TextPart(text="written")]), usage=usage)


register_provider("otel-flaky", lambda agent, model: _FlakyAdapter(model))


flaky = AgentDefinition(
    id="otel_t.flaky",
    allowed_tools=["otel_write"],
    read_only=False,
    mutation_policy="confirm-required",
    default_provider="otel-flaky",
    default_model="primary",
    fallbacks=[{"provider": "otel-flaky", "model": "backup"}],
    **HOOKS,
)

held = AgentDefinition(
    id="otel_t.held",
    allowed_tools=["otel_quick", "otel_hold"],
    script=[
        ScriptStep(text="looking", tool_calls=[ScriptToolCall(name="otel_quick", args={"key": "a"}, id="call_q")]),
        ScriptStep(text="holding", tool_calls=[ScriptToolCall(name="otel_hold", args={}, id="call_h")]),
        ScriptStep(text="done"),
    ],
    **HOOKS,
)


def _prepared(ctx: StepContext) -> StepOverrides:
    return StepOverrides(system=f"prepared for step {ctx.step}")


hooked = AgentDefinition(
    id="otel_t.hooked",
    system_prompt="Hooked.",
    allowed_tools=["otel_quick"],
    prepare_step=_prepared,
    script=[
        ScriptStep(text="looking", tool_calls=[ScriptToolCall(name="otel_quick", args={"key": "b"}, id="call_b")]),
        ScriptStep(text="found"),
    ],
    **HOOKS,
)


def _broken(info: Any) -> None:
    raise ValueError("hook broke")


raising = AgentDefinition(id="otel_t.raising", script=[ScriptStep(text="fine")], on_step_finish=_broken)
strict = AgentDefinition(id="otel_t.strict", script=[ScriptStep(text="never")], on_step_start=fails_turn(_broken))


def _follow_up(result: TurnResult) -> str | None:
    """Continue the thread once: after the first turn's answer, ask again."""
    _record("on_turn_finish", {"turn": result.turn_id}, result)
    return "and then?" if result.text == "first answer" else None


def _answers(request: FunctionRequest) -> str:
    last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
    return "second answer" if last.content == "and then?" else "first answer"


following = AgentDefinition(id="otel_t.following", function_model=FunctionModel(_answers), on_turn_finish=_follow_up)


@tool
def otel_secret() -> dict[str, str]:
    """Returns the provider key from the environment (a tool that leaks what it must not)."""
    return {"token": os.environ.get("ANTHROPIC_API_KEY", "")}


leaky = AgentDefinition(
    id="otel_t.leaky",
    allowed_tools=["otel_secret"],
    script=[
        ScriptStep(text="peeking", tool_calls=[ScriptToolCall(name="otel_secret", args={}, id="call_s")]),
        ScriptStep(text="seen"),
    ],
)
