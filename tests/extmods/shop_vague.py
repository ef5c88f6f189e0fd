"""An agent naming `shop_lookup` without declaring or importing one, while shops A and B both declare it."""

from __future__ import annotations

from stepq import AgentDefinition, TestModel

agent = AgentDefinition(id="shopvague.agent", allowed_tools=["shop_lookup"], function_model=TestModel())
