"""Agents and tools for the OpenAI adapter tests (tests/test_provider_openai.py).

They run against the local fake OpenAI API (tests/fakes/openai_server.py) reached through the SDK's base
URL; the model names are arbitrary because the fake ignores them.
"""

from __future__ import annotations

from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool


class OpenAIContact(BaseModel):
    name: str
    email: str


@tool
def openai_lookup(query: str) -> dict[str, str]:
    """Look a query up and return its answer."""
    return {"answer": f"result for {query}"}


@tool
def openai_fail(reason: str) -> dict[str, str]:
    """A tool that always fails with the given reason."""
    raise RuntimeError(reason)


chat = AgentDefinition(
    id="openai_t.chat",
    system_prompt="You are a terse test assistant.",
    allowed_tools=["openai_lookup", "openai_fail"],
    default_provider="openai",
    default_model="gpt-test",
)

reasoning = AgentDefinition(
    id="openai_t.reasoning",
    allowed_tools=["openai_lookup"],
    default_provider="openai",
    default_model="o-test",
    provider_options={"reasoning_effort": "low", "reasoning_summary": "auto"},
)

extract = AgentDefinition(
    id="openai_t.extract",
    execution_mode="object",
    output=OpenAIContact,
    default_provider="openai",
    default_model="gpt-test",
    provider_options={"strict": True},
)

compat = AgentDefinition(
    id="openai_t.compat",
    system_prompt="Compatible server.",
    allowed_tools=["openai_lookup"],
    default_provider="openai-compatible",
    default_model="local-model",
)

compat_extract = AgentDefinition(
    id="openai_t.compat_extract",
    execution_mode="object",
    output=OpenAIContact,
    default_provider="openai-compatible",
    default_model="local-model",
)

azure = AgentDefinition(
    id="openai_t.azure",
    allowed_tools=["openai_lookup"],
    default_provider="azure-openai",
    default_model="my-deployment",
)

stall = AgentDefinition(
    id="openai_t.stall",
    default_provider="openai",
    default_model="gpt-test",
    # longer than any gap in a healthy reply on a loaded machine; the stall test waits this long once
    provider_options={"stall_timeout_s": 5.0},
)

compat_keyed = AgentDefinition(
    id="openai_t.compat_keyed",
    default_provider="openai-compatible",
    default_model="local-model",
    provider_options={"api_key_env": "OPENAI_T_COMPAT_KEY"},  # the key comes from a variable of the agent's own
)

FILES = ["image/*", "application/pdf", "text/plain"]
files = AgentDefinition(
    id="openai_t.files", default_provider="openai", default_model="gpt-test", accepted_media_types=FILES
)
compat_files = AgentDefinition(
    id="openai_t.compat_files",
    default_provider="openai-compatible",
    default_model="local-vision",
    accepted_media_types=FILES,
    provider_options={"file_parts": True},  # this server takes OpenAI's PDF `file` parts
)
compat_no_pdf = AgentDefinition(
    id="openai_t.compat_no_pdf",
    default_provider="openai-compatible",
    default_model="local-vision",
    accepted_media_types=FILES,  # accepted by the agent, but its server takes no PDF parts
)
azure_files = AgentDefinition(
    id="openai_t.azure_files",
    default_provider="azure-openai",
    default_model="my-deployment",
    accepted_media_types=FILES,
)

one_call = AgentDefinition(
    id="openai_t.one_call",
    allowed_tools=["openai_lookup", "openai_fail"],
    default_provider="openai",
    default_model="gpt-test",
    parallel_tool_calls=False,  # sent as parallel_tool_calls: false
)
