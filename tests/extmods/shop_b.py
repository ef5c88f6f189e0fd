"""A second shop declaring its own `shop_lookup` (see `shop_a`)."""

from __future__ import annotations

from stepq import AgentDefinition, TestModel, tool


@tool
def shop_lookup(order_id: str) -> dict[str, str]:
    """Look an order up in shop B."""
    return {"shop": "b", "order_id": order_id}


agent = AgentDefinition(id="shopb.agent", allowed_tools=["shop_lookup"], function_model=TestModel())
