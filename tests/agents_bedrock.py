"""Agents and tools for the Bedrock adapter tests (run against tests/fakes/bedrock_server.py)."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool

# a colon in the model id: the SDK must URL-encode it into /model/{modelId}/converse-stream
BEDROCK_MODEL = "anthropic.claude-3-5-sonnet-20241022-v2:0"


@tool
def bedrock_lookup(key: str) -> dict[str, str]:
    """Look a key up in a tiny table."""
    return {"key": key, "value": f"value-of-{key}"}


@tool
def bedrock_explode(reason: str) -> dict[str, str]:
    """Always fails, so the model sees a tool error."""
    raise ValueError(f"exploded: {reason}")


chat = AgentDefinition(
    id="bedrock_t.chat",
    system_prompt="You are terse.",
    default_provider="bedrock",
    default_model=BEDROCK_MODEL,
    max_output_tokens=256,
    temperature=0.2,
    stop_sequences=["END"],
)

tools = AgentDefinition(
    id="bedrock_t.tools",
    system_prompt="Use the tools.",
    default_provider="bedrock",
    default_model=BEDROCK_MODEL,
    allowed_tools=["bedrock_lookup", "bedrock_explode"],
)

thinking = AgentDefinition(
    id="bedrock_t.thinking",
    default_provider="bedrock",
    default_model=BEDROCK_MODEL,
    allowed_tools=["bedrock_lookup"],
    provider_options={"thinking_budget": 1024},
)

stall = AgentDefinition(
    id="bedrock_t.stall",
    default_provider="bedrock",
    default_model=BEDROCK_MODEL,
    # longer than any gap in a healthy reply on a loaded machine (a 0.5 s watchdog fired on those), and than
    # a cancel takes to reach the worker; the stall tests wait this long once
    provider_options={"stall_timeout_s": 5.0},
)

one_call = AgentDefinition(
    id="bedrock_t.one_call",
    system_prompt="One tool at a time.",
    default_provider="bedrock",
    default_model=BEDROCK_MODEL,
    allowed_tools=["bedrock_lookup", "bedrock_explode"],
    parallel_tool_calls=False,  # Converse has no switch for it: the engine runs only the first call
)
