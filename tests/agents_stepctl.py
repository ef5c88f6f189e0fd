"""Agents, tools and stop conditions for the per-step control, stop condition and trace tests (ids `sc.*`,
tools `sc_*`, stop conditions `sc.*`). Offline: scripted steps and function models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from stepq.agents import AgentDefinition, LoopConfig, StopWhen
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.stops import StopContext, stop_condition
from stepq.tools import tool

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
