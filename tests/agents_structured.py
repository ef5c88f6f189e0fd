"""Object-mode agents for the native structured-output tests (ids `st.*`, tools `st_*`)."""

from __future__ import annotations

from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall


class StContact(BaseModel):
    name: str
    email: str


@tool
def st_lookup(name: str) -> dict[str, str]:
    """Find a person's email address."""
    return {"name": name, "email": f"{name.lower()}@example.com"}


anthropic_extract = AgentDefinition(
    id="st.anthropic_extract",
    execution_mode="object",
    output=StContact,
    default_provider="anthropic",
    default_model="claude-fake",
)

anthropic_tools_first = AgentDefinition(
    id="st.anthropic_tools_first",
    execution_mode="object",
    output=StContact,
    allowed_tools=["st_lookup"],
    loop=LoopConfig(max_steps=2),
    default_provider="anthropic",
    default_model="claude-fake",
)

bedrock_extract = AgentDefinition(
    id="st.bedrock_extract",
    execution_mode="object",
    output=StContact,
    output_repairs=2,
    default_provider="bedrock",
    default_model="anthropic.claude-fake-v1:0",
)

scripted_tools_first = AgentDefinition(
    id="st.scripted_tools_first",
    execution_mode="object",
    output={"type": "array", "items": {"type": "string"}},
    allowed_tools=["st_lookup"],
    loop=LoopConfig(max_steps=3),
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="st_lookup", args={"name": "Ada"})]),
        ScriptStep(object=["ada@example.com"]),
    ],
)

gemini_extract = AgentDefinition(
    id="st.gemini_extract",
    execution_mode="object",
    output=StContact,
    default_provider="gemini",
    default_model="gemini-fake",
)

gemini_tools_first = AgentDefinition(
    id="st.gemini_tools_first",
    execution_mode="object",
    output=StContact,
    allowed_tools=["st_lookup"],
    loop=LoopConfig(max_steps=2),
    default_provider="gemini",
    default_model="gemini-fake",
)
