"""Agents, tools and stop conditions for the per-step control, stop condition and trace tests (ids `sc.*`,
tools `sc_*`, stop conditions `sc.*`). Offline: scripted steps and function models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition, LoopConfig, StopWhen
from stepq.agents.step_control import StepContext, StepOverrides
from stepq.agents.stops import StopContext, stop_condition
from stepq.agents.tools import tool
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall

SEEN: dict[str, list[dict[str, Any]]] = {}  # what each stop condition was asked, by turn id (in-process tests)


@tool
def sc_charge(amount: int) -> dict[str, object]:
    """Charge an amount; the invoice is paid from 100 on."""
    return {"charged": amount, "paid": amount >= 100}


@tool
def sc_lookup(key: str) -> dict[str, str]:
    """Look a key up."""
    return {"key": key, "value": key.upper()}


@tool(is_mutation=True)
def sc_write(key: str) -> dict[str, str]:
    """A mutation tool (hidden while the agent is read-only)."""
    return {"written": key}


@stop_condition("sc.billing_paid")
def billing_paid(ctx: StopContext) -> bool:
    """Stop once a charge in the step reports the invoice paid."""
    SEEN.setdefault(ctx.turn_id, []).append(
        {
            "step": ctx.step,
            "calls": [c.name for c in ctx.tool_calls],
            "results": [r.output for r in ctx.results],
            "tokens": ctx.usage.total_tokens,
            "made": ctx.tool_calls_made,
            "metadata": dict(ctx.metadata),
        }
    )
    return any(isinstance(r.output, dict) and r.output.get("paid") for r in ctx.results)


@stop_condition("sc.broken")
def broken(ctx: StopContext) -> bool:
    raise RuntimeError("ledger unreachable")


def _call(name: str, **args: object) -> ScriptToolCall:
    return ScriptToolCall(name=name, args=args)


_CHARGES = [
    ScriptStep(text="charging 50", tool_calls=[_call("sc_charge", amount=50)], input_tokens=7, output_tokens=3),
    ScriptStep(text="charging 150", tool_calls=[_call("sc_charge", amount=150)], input_tokens=7, output_tokens=3),
    ScriptStep(text="charging again", tool_calls=[_call("sc_charge", amount=1)]),
    ScriptStep(text="never reached"),
]

paid = AgentDefinition(
    id="sc.paid",
    allowed_tools=["sc_charge"],
    loop=LoopConfig(max_steps=8, stop_when=[StopWhen(custom="sc.billing_paid")]),
    script=_CHARGES,
)

charges = AgentDefinition(  # no stop condition of its own: callers add one in their overrides
    id="sc.charges",
    allowed_tools=["sc_charge"],
    loop=LoopConfig(max_steps=8),
    script=_CHARGES,
)

broken_stop = AgentDefinition(
    id="sc.broken_stop",
    allowed_tools=["sc_charge"],
    loop=LoopConfig(max_steps=8, stop_when=[StopWhen(custom="sc.broken")]),
    script=_CHARGES,
)


class Invoice(BaseModel):
    paid: bool


paid_object = AgentDefinition(  # object mode: the custom stop spends the reserved answer step
    id="sc.paid_object",
    allowed_tools=["sc_charge"],
    execution_mode="object",
    output=Invoice,
    loop=LoopConfig(max_steps=8, stop_when=[StopWhen(custom="sc.billing_paid")]),
    script=[*_CHARGES[:2], ScriptStep(object={"paid": True})],
)


# --------------------------------------------------------------------------- per-step control

PLANS: dict[str, list[tuple[int, int, list[str]]]] = {}  # prepare_step's context, by turn id
REQUESTS: dict[str, list[dict[str, Any]]] = {}  # what the function model was asked, by prompt


def _asked(request: FunctionRequest) -> None:
    REQUESTS.setdefault(request.prompt, []).append(
        {
            "step": request.step,
            "tools": [t.name for t in request.tools],
            "choice": request.tool_choice,
            "system": request.system,
        }
    )


def _prepared_model(request: FunctionRequest) -> FunctionResponse:
    _asked(request)
    if request.step == 0:
        return FunctionResponse(tool_calls=[_call("sc_lookup", key="a")])
    if request.step == 1:  # sc_lookup is not shown on this step: the engine refuses the call
        return FunctionResponse(tool_calls=[_call("sc_charge", amount=5), _call("sc_lookup", key="b")])
    if request.tool_choice == "none":
        return FunctionResponse(text="done")
    return FunctionResponse(text="calling anyway", tool_calls=[_call("sc_lookup", key="c")])


def _prepare(ctx: StepContext) -> StepOverrides | dict[str, Any] | None:
    PLANS.setdefault(ctx.turn_id, []).append((ctx.step, ctx.usage.total_tokens, [c.name for c in ctx.last_tool_calls]))
    if ctx.step == 0:
        return {
            "active_tools": ["sc_lookup"],
            "tool_choice": "sc_lookup",
            "system": "Look it up first.",
            "max_output_tokens": 64,
        }
    if ctx.step == 1:  # sc_write is a write the read-only agent hides: asking for it widens nothing
        return StepOverrides(model="other-model", active_tools=["sc_charge", "sc_write"])
    return {"tool_choice": "none"}


prepared = AgentDefinition(
    id="sc.prepared",
    system_prompt="Base prompt.",
    allowed_tools=["sc_lookup", "sc_charge", "sc_write"],
    prepare_step=_prepare,
    max_output_tokens=500,
    loop=LoopConfig(max_steps=6),
    function_model=FunctionModel(_prepared_model),
)


def _echo_model(request: FunctionRequest) -> FunctionResponse:
    _asked(request)
    if request.step < 2 and request.tool_choice != "none":
        name = request.tool_choice if request.tool_choice not in (None, "auto", "required") else request.tools[0].name
        return FunctionResponse(tool_calls=[_call(name, **({"key": "k"} if name == "sc_lookup" else {"amount": 1}))])
    return FunctionResponse(text="done")


choices = AgentDefinition(  # no static choice: callers may narrow it
    id="sc.choices",
    allowed_tools=["sc_lookup", "sc_charge", "sc_write"],
    function_model=FunctionModel(_echo_model),
)

static = AgentDefinition(
    id="sc.static",
    allowed_tools=["sc_lookup", "sc_charge"],
    active_tools=["sc_charge"],
    tool_choice="required",
    function_model=FunctionModel(_echo_model),
)


def _raising(ctx: StepContext) -> None:
    raise ValueError("no plan for step 0")


bad_prepare = AgentDefinition(
    id="sc.bad_prepare", allowed_tools=["sc_lookup"], prepare_step=_raising, function_model=FunctionModel(_echo_model)
)

bad_return = AgentDefinition(
    id="sc.bad_return",
    allowed_tools=["sc_lookup"],
    prepare_step=lambda ctx: {"tool_choice": "auto", "seed": 2},  # no such override (sampling is: temperature...)
    function_model=FunctionModel(_echo_model),
)

PREPARED_STEPS: dict[str, list[int]] = {}


def _count_prepare(ctx: StepContext) -> dict[str, Any]:
    PREPARED_STEPS.setdefault(ctx.turn_id, []).append(ctx.step)
    return {"model": "scripted/switched"} if ctx.step == 0 else {}


retried = AgentDefinition(  # step 0 fails once before content: its retry keeps the plan (prepare_step runs once)
    id="sc.retried",
    allowed_tools=["sc_lookup"],
    prepare_step=_count_prepare,
    script=[
        ScriptStep(
            text="looking", tool_calls=[_call("sc_lookup", key="r")], fail=ScriptFailure(status=503, retry_after_s=0)
        ),
        ScriptStep(text="done"),
    ],
)


# --------------------------------------------------------------------------- tool_choice on the wire

WIRE_CHOICES = ["auto", "required", "sc_lookup", "none"]


def _wire_plan(ctx: StepContext) -> dict[str, Any]:
    """The step's tool choice comes from the turn's metadata; step 1 shows only sc_lookup."""
    chosen = list(ctx.metadata.get("choices") or WIRE_CHOICES)
    plan: dict[str, Any] = {"tool_choice": chosen[min(ctx.step, len(chosen) - 1)]}
    if ctx.step == 1:
        plan["active_tools"] = ["sc_lookup"]
    return plan


def _wire_agent(provider: str, model: str) -> AgentDefinition:
    return AgentDefinition(
        id=f"sc.wire_{provider.replace('-', '_')}",
        system_prompt="Wire test.",
        allowed_tools=["sc_lookup", "sc_charge"],
        prepare_step=_wire_plan,
        default_provider=provider,
        default_model=model,
    )


wire_anthropic = _wire_agent("anthropic", "claude-test")
wire_gemini = _wire_agent("gemini", "gemini-test")
wire_bedrock = _wire_agent("bedrock", "anthropic.claude-test")
wire_openai = _wire_agent("openai", "gpt-test")
wire_compat = _wire_agent("openai-compatible", "local-model")
