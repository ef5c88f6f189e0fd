"""A shop whose agent has a tool named `shop_lookup`, as does `shop_b`'s: each agent must run its own."""

from __future__ import annotations

from stepq import AgentDefinition, TestModel, tool


@tool
def shop_lookup(order_id: str) -> dict[str, str]:
    """Look an order up in shop A."""
    return {"shop": "a", "order_id": order_id}


agent = AgentDefinition(id="shopa.agent", allowed_tools=["shop_lookup"], function_model=TestModel())
