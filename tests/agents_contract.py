"""Agents for tests/test_agent_contract.py: strict tools, per-step sampling, provider fall-through, the repair
hook and deferred tool calls."""

from __future__ import annotations

import json
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.agents.step_control import StepContext
from stepq.agents.tools import tool
from stepq.models import Fallback, ToolCall


@tool(strict=True)
def ac_lookup(order_id: str) -> dict[str, str]:
    """Look an order up by its id."""
    return {"order_id": order_id, "status": "shipped"}


@tool
def ac_note(text: str, limit: int | None = None) -> str:
    """Write a note (its `limit` is optional, so its schema is not strict-compatible)."""
    return text[: limit or None]


@tool
def ac_pair(left: str, right: int) -> str:
    """Pair two values (every argument required: strict-compatible)."""
    return f"{left}:{right}"


# --------------------------------------------------------------------------- strict tools on the wire


def _strict_agent(provider: str, model: str, **extra: Any) -> AgentDefinition:
    return AgentDefinition(
        id=f"ac.strict_{provider.replace('-', '_')}",
        system_prompt="Strict test.",
        allowed_tools=["ac_lookup", "ac_pair"],
        default_provider=provider,
        default_model=model,
        **extra,
    )


# the tool's own `strict=True` (ac_lookup) and the agent-wide default (strict_tools, for ac_pair)
strict_openai = _strict_agent("openai", "gpt-test")  # ac_lookup strict, ac_pair not
strict_compat = _strict_agent("openai-compatible", "local-model", strict_tools=True)
strict_anthropic = _strict_agent("anthropic", "claude-test", strict_tools=True)
strict_gemini = _strict_agent("gemini", "gemini-test", strict_tools=True)  # no strict mode: engine validation
strict_bedrock = _strict_agent("bedrock", "anthropic.claude-test", strict_tools=True)


# --------------------------------------------------------------------------- sampling per step


def _sampling_plan(ctx: StepContext) -> dict[str, Any]:
    """Step 0 sets every sampling field; step 1 keeps the agent's defaults."""
    if ctx.step == 0:
        return {
            "temperature": 0.3,
            "top_p": 0.8,
            "reasoning_effort": "low",
            "thinking_budget": 2048,
            "max_output_tokens": 4096,
        }
    return {}


def _sampling_agent(provider: str, model: str) -> AgentDefinition:
    return AgentDefinition(
        id=f"ac.sampling_{provider.replace('-', '_')}",
        system_prompt="Sampling test.",
        allowed_tools=["ac_lookup"],
        prepare_step=_sampling_plan,
        temperature=0.9,
        top_p=0.5,
        reasoning_effort="high",
        thinking_budget=1024,
        max_output_tokens=3000,
        default_provider=provider,
        default_model=model,
    )


sampling_anthropic = _sampling_agent("anthropic", "claude-test")
sampling_openai = _sampling_agent("openai", "gpt-test")
sampling_compat = _sampling_agent("openai-compatible", "local-model")
sampling_gemini = _sampling_agent("gemini", "gemini-test")
sampling_bedrock = _sampling_agent("bedrock", "anthropic.claude-test")


# --------------------------------------------------------------------------- provider fall-through


def _fall_through_agent(name: str, allowed: bool) -> AgentDefinition:
    """Anthropic by default; then Gemini, then OpenAI (the test configures only OpenAI)."""
    return AgentDefinition(
        id=f"ac.{name}",
        default_provider="anthropic",
        default_model="claude-test",
        fallbacks=[Fallback(provider="gemini", model="gemini-test"), Fallback(provider="openai", model="gpt-test")],
        fall_through_unconfigured=allowed,
    )


falls_through = _fall_through_agent("falls_through", True)
fails_closed = _fall_through_agent("fails_closed", False)


# --------------------------------------------------------------------------- the repair hook

REPAIRS: dict[str, list[str]] = {}  # call id -> the error of each time the hook was asked about it


def _close_json(call: ToolCall, error: str) -> ToolCall | None:
    """Close an unterminated JSON object, rename a misspelt tool or argument; give up (None) on anything else."""
    REPAIRS.setdefault(call.id, []).append(error)
    if error.startswith("no tool named") and call.name == "lookup":
        return call.model_copy(update={"name": "ac_lookup"})
    if error.startswith("invalid arguments for") and set(call.args) == {"id"}:
        return call.model_copy(update={"args": {"order_id": call.args["id"]}})
    raw = str((call.provider_data or {}).get("invalid_json", ""))
    try:
        args = json.loads(raw + "}")
    except ValueError:
        return None
    # a copy that still carries the raw text and another id: the engine keeps the id and drops the raw text
    return call.model_copy(update={"args": args, "id": "ignored: the call keeps its id"})


repairing = AgentDefinition(
    id="ac.repairing",
    allowed_tools=["ac_lookup"],
    default_provider="openai",
    default_model="gpt-test",
    repair_tool_call=_close_json,
)
not_repairing = AgentDefinition(
    id="ac.not_repairing", allowed_tools=["ac_lookup"], default_provider="openai", default_model="gpt-test"
)


# --------------------------------------------------------------------------- deferred tool calls

RAN: dict[str, list[str]] = {}  # tool name -> the order ids it really ran for, on this side


@tool
def ac_stock(order_id: str) -> str:
    """Check the stock for an order (read-only: it would run here without deferral)."""
    RAN.setdefault("ac_stock", []).append(order_id)
    return f"in stock: {order_id}"


@tool(is_mutation=True)
def ac_refund(order_id: str) -> str:
    """Refund an order (a mutation: it needs a person's approval)."""
    RAN.setdefault("ac_refund", []).append(order_id)
    return f"refunded {order_id}"


deferring = AgentDefinition(
    id="ac.deferring",
    allowed_tools=["ac_stock", "ac_refund"],
    read_only=False,
    default_provider="openai",
    default_model="gpt-test",
)
planning_deferring = AgentDefinition(
    id="ac.planning_deferring",
    allowed_tools=["ac_stock"],
    task_plan=True,
    default_provider="openai",
    default_model="gpt-test",
)
