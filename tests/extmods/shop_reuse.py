"""An agent that reuses shop A's `shop_lookup` by importing it: that is the one it means."""

from __future__ import annotations

from stepq import AgentDefinition, TestModel
from tests.extmods.shop_a import shop_lookup

__all__ = ["shop_lookup"]

agent = AgentDefinition(id="shopreuse.agent", allowed_tools=["shop_lookup"], function_model=TestModel())
