"""Agents and tools for the tenancy tests (ids `ten.*`, tools `ten_*`): policy layers for stop conditions and
tool choice, budget presets, the runtime context and prepare_call, tenant models, keys and quotas.

Offline (a function model) unless an agent names a real provider, which the tests point at a wire fake.
`prepare_call` counts its calls in Redis under the turn's metadata prefix, so a test proves it ran once.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from pydantic import BaseModel, Field

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.runtime_context import CallContext
from stepq.agents.step_control import StepContext
from stepq.agents.tools import ToolContext, tool
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall

_redis = redis.Redis.from_url(os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True)


def prepare_calls_key(prefix: str, turn_id: str) -> str:
    return f"{prefix}:ten-prepare-call:{turn_id}"


@tool
def ten_lookup(key: str) -> dict[str, str]:
    """Look a key up."""
    return {"key": key}


@tool
def ten_hand_over() -> dict[str, bool]:
    """Hand the conversation to a person."""
    return {"handed_over": True}


class Account(BaseModel):
    """The runtime context of a `ten.ctx` turn: who the tools act for (never shown to the model)."""

    account_id: str = Field(min_length=1)
    plan: str = "free"
    unit: str = "celsius"


@tool
def ten_whoami(ctx: ToolContext) -> dict[str, Any]:
    """Say which account this turn acts for."""
    account = ctx.context
    assert isinstance(account, Account), type(account)  # the tool reads an instance of the schema
    return {"account": account.account_id, "plan": account.plan, "unit": account.unit}


def _calls_tools(request: FunctionRequest) -> FunctionResponse | str:
    """Call the first shown tool on every step until the loop stops it (tool_choice none: answer)."""
    shown = [t.name for t in request.tools]
    if not shown or request.tool_choice == "none":
        return f"answered on step {request.step} (tool_choice {request.tool_choice})"
    name = request.tool_choice if request.tool_choice in shown else shown[0]
    args = {"key": f"k{request.step}"} if name == "ten_lookup" else {}
    return FunctionResponse(text="calling", tool_calls=[ScriptToolCall(name=name, args=args)])


looper = AgentDefinition(  # calls a tool on every step: only a stop condition or max_steps ends it
    id="ten.looper",
    allowed_tools=["ten_lookup", "ten_hand_over"],
    loop=LoopConfig(max_steps=8),
    function_model=FunctionModel(_calls_tools),
)

small = AgentDefinition(  # a budget by preset name
    id="ten.small",
    loop=LoopConfig(budget="small"),
    script=[ScriptStep(text="ok")],
)


def _upgrade(step: StepContext) -> dict[str, Any] | None:
    """After the first tool step, the account's plan becomes `pro` for the later steps and their tools."""
    if step.step == 1:
        account = step.context
        assert isinstance(account, Account)
        return {"context": account.model_copy(update={"plan": "pro"})}
    return None


def _once(call: CallContext) -> dict[str, Any]:
    prefix = str(call.metadata.get("prefix"))
    _redis.incr(prepare_calls_key(prefix, call.turn_id))
    account = call.context
    assert isinstance(account, Account)
    return {
        "instructions": f"You act for account {account.account_id}.",
        "context": {**account.model_dump(), "unit": "kelvin"},
    }


def _whoami_twice(request: FunctionRequest) -> FunctionResponse | str:
    """Two steps call ten_whoami, then the answer repeats the system text it was sent."""
    if request.step < 2:
        return FunctionResponse(text="checking", tool_calls=[ScriptToolCall(name="ten_whoami", args={})])
    return f"system: {request.system}"


ctx_agent = AgentDefinition(
    id="ten.ctx",
    system_prompt="You look accounts up.",
    allowed_tools=["ten_whoami"],
    context_schema=Account,
    prepare_step=_upgrade,
    prepare_call=_once,
    function_model=FunctionModel(_whoami_twice),
)

ctx_flaky = AgentDefinition(  # the first model call fails (retryable): step 0 is delivered twice
    id="ten.ctx_flaky",
    context_schema=Account,
    prepare_call=_once,
    script=[ScriptStep(fail=ScriptFailure(status=503, message="overloaded"), text="after a retry")],
)

claude = AgentDefinition(  # on the Anthropic wire fake (ANTHROPIC_BASE_URL): which key each call carries
    id="ten.claude",
    allowed_tools=["ten_lookup"],
    default_provider="anthropic",
    default_model="claude-test",
)


def _echo_system(request: FunctionRequest) -> str:
    return f"{request.options.get('label', '')}system: {request.system}"


sections = AgentDefinition(  # answers with the system text it was sent, on the model it runs on
    id="ten.sections",
    system_prompt="You help.",
    prompt_sections={"tone": "Be brief.", "scope": "Only billing."},
    default_model="function/function",
    fallbacks=["function/backup"],
    function_model=FunctionModel(_echo_system),
)
