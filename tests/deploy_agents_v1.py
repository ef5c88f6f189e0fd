"""Version 1 of the agents a rolling-upgrade test deploys (tests/test_deploys.py); tests/deploy_agents_v2.py is
the next deploy of the same agent ids. A worker loads one of the two (its STEPQ_AGENT_MODULES)."""

from __future__ import annotations

import redis

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

VERSION = "v1"
_redis = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)


def ran(ctx: ToolContext, tool_name: str) -> dict[str, object]:
    """Count the run under the test's prefix, and say which deploy ran it."""
    prefix = ctx.metadata.get("prefix") or ctx.metadata["tenant"]  # a chat turn's tenant is the test's prefix
    count = _redis.incr(f"{prefix}:ran:{ctx.turn_id}:{tool_name}")
    _redis.set(f"{prefix}:ran-by:{ctx.turn_id}:{tool_name}", VERSION)
    return {"ran_on": VERSION, "count": count}


@tool(is_mutation=True)
def dp_refund(order_id: str, amount: int, ctx: ToolContext) -> dict[str, object]:
    """Refund an order (needs a person's approval)."""
    return ran(ctx, "dp_refund")


@tool(is_mutation=True)
def dp_charge(order_id: str, amount: int, ctx: ToolContext) -> dict[str, object]:
    """Charge an order (needs a person's approval)."""
    return ran(ctx, "dp_charge")


def _script(tool_name: str) -> list[ScriptStep]:
    call = ScriptToolCall(name=tool_name, args={"order_id": "A1", "amount": 5})
    return [ScriptStep(text=f"calling {tool_name}", tool_calls=[call]), ScriptStep(text=f"answered by {VERSION}")]


refunds = AgentDefinition(
    id="deploy.refunds",
    version=VERSION,
    system_prompt="You refund orders.",
    allowed_tools=["dp_refund"],
    read_only=False,
    script=_script("dp_refund"),
)

charges = AgentDefinition(
    id="deploy.charges",
    version=VERSION,
    allowed_tools=["dp_charge"],
    read_only=False,
    on_incompatible_upgrade="pin",
    script=_script("dp_charge"),
)

charges_fail = AgentDefinition(
    id="deploy.charges_fail",
    version=VERSION,
    allowed_tools=["dp_charge"],
    read_only=False,
    on_incompatible_upgrade="fail",
    script=_script("dp_charge"),
)
