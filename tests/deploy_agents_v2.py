"""Version 2 of tests/deploy_agents_v1.py's agents, the next deploy: same ids, changed definitions.

- deploy.refunds changes compatibly: new prompt text, a new tool, `dp_refund`'s schema loosened (`amount` may be
  text too).
- deploy.charges and deploy.charges_fail change incompatibly for a turn parked on `dp_charge`: its schema now
  requires a currency, which the stored arguments of a pending approval lack.
"""

from __future__ import annotations

import redis

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall

VERSION = "v2"
_redis = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)


def ran(ctx: ToolContext, tool_name: str) -> dict[str, object]:
    """Count the run under the test's prefix, and say which deploy ran it (as v1's does)."""
    prefix = ctx.metadata.get("prefix") or ctx.metadata["tenant"]  # a chat turn's tenant is the test's prefix
    count = _redis.incr(f"{prefix}:ran:{ctx.turn_id}:{tool_name}")
    _redis.set(f"{prefix}:ran-by:{ctx.turn_id}:{tool_name}", VERSION)
    return {"ran_on": VERSION, "count": count}


@tool(is_mutation=True)
def dp_refund(order_id: str, amount: int | str, ctx: ToolContext) -> dict[str, object]:
    """Refund an order; the amount may now be given as text too (needs a person's approval)."""
    return ran(ctx, "dp_refund")


@tool
def dp_lookup(order_id: str) -> dict[str, str]:
    """Look an order up (new in v2)."""
    return {"order_id": order_id}


@tool(is_mutation=True)
def dp_charge(order_id: str, amount: int, currency: str, ctx: ToolContext) -> dict[str, object]:
    """Charge an order in a currency (needs a person's approval)."""
    return ran(ctx, "dp_charge")


def _script(tool_name: str, **extra: object) -> list[ScriptStep]:
    call = ScriptToolCall(name=tool_name, args={"order_id": "A1", "amount": 5, **extra})
    return [ScriptStep(text=f"calling {tool_name}", tool_calls=[call]), ScriptStep(text=f"answered by {VERSION}")]


refunds = AgentDefinition(
    id="deploy.refunds",
    version=VERSION,
    system_prompt="You refund orders, politely.",
    allowed_tools=["dp_refund", "dp_lookup"],
    read_only=False,
    script=_script("dp_refund"),
)

charges = AgentDefinition(
    id="deploy.charges",
    version=VERSION,
    allowed_tools=["dp_charge"],
    read_only=False,
    on_incompatible_upgrade="pin",
    script=_script("dp_charge", currency="EUR"),
)

charges_fail = AgentDefinition(
    id="deploy.charges_fail",
    version=VERSION,
    allowed_tools=["dp_charge"],
    read_only=False,
    on_incompatible_upgrade="fail",
    script=_script("dp_charge", currency="EUR"),
)
