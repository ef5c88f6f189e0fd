"""Agents for the provider-batch tests (tests/test_provider_batch.py): one on the `anthropic` provider
(reached through the fake Messages API, batches included), one on the offline scripted model."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall


@tool
def pbatch_lookup(sku: str) -> dict[str, str]:
    """Look a product up by SKU."""
    return {"sku": sku, "name": f"product {sku}"}


anthropic_tools = AgentDefinition(
    id="agents_pbatch.anthropic_tools",
    system_prompt="Enrich the product record.",
    allowed_tools=["pbatch_lookup"],
    default_provider="anthropic",
    default_model="claude-batch-test",
    priority="batch",
)

scripted = AgentDefinition(
    id="agents_pbatch.scripted",
    allowed_tools=["pbatch_lookup"],
    default_provider="scripted",
    default_model="scripted-1",
    priority="batch",
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="pbatch_lookup", args={"sku": "A-1"})]),
        ScriptStep(text="enriched A-1", input_tokens=1000, output_tokens=200),
    ],
)

scripted_flaky = AgentDefinition(
    id="agents_pbatch.scripted_flaky",
    default_provider="scripted",
    default_model="scripted-1",
    priority="batch",
    script=[ScriptStep(text="done", fail=ScriptFailure(status=529, message="overloaded", times=1))],
)

gemini_tools = AgentDefinition(
    id="agents_pbatch.gemini_tools",
    system_prompt="Enrich the product record.",
    allowed_tools=["pbatch_lookup"],
    default_provider="gemini",
    default_model="gemini-batch-test",
    priority="batch",
)

bedrock_tools = AgentDefinition(
    id="agents_pbatch.bedrock_tools",
    system_prompt="Enrich the product record.",
    allowed_tools=["pbatch_lookup"],
    default_provider="bedrock",
    default_model="anthropic.claude-batch-test-v1:0",
    priority="batch",
)
