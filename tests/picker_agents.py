"""Agents for the picker metadata tests (tests/test_agent_metadata.py): one sets every field, one sets none.
Not named agents*.py, so the other tests' agent modules leave it out."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition
from stepq.providers.scripted import ScriptStep

desk = AgentDefinition(
    id="picker.refund_desk",
    label="Refund Desk",
    description="Refunds damaged orders.",
    keywords=["refunds", "orders"],
    domain="billing",
    data_capabilities=["orders: read", "refunds: issue"],
    default_model="anthropic/claude-haiku-4-5",
    fallbacks=["bedrock/anthropic.claude-3-haiku"],
)

plain = AgentDefinition(id="picker.plain_helper", script=[ScriptStep(text="hello")])
