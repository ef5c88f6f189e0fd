"""Agents and tools for the Anthropic adapter tests (tests/test_provider_anthropic.py).

They run against the local fake Messages API (tests/fakes/anthropic_server.py) reached
through ANTHROPIC_BASE_URL; the model names are arbitrary because the fake ignores them.
"""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool
from stepq.providers.scripted import ScriptStep


@tool
def anthropic_lookup(query: str) -> dict[str, str]:
    """Look a query up and return its answer."""
    return {"answer": f"result for {query}"}


@tool
def anthropic_fail(reason: str) -> dict[str, str]:
    """A tool that always fails with the given reason."""
    raise RuntimeError(reason)


chat = AgentDefinition(
    id="anthropic_t.chat",
    system_prompt="You are a terse test assistant.",
    allowed_tools=["anthropic_lookup", "anthropic_fail"],
    default_provider="anthropic",
    default_model="claude-test",
)

thinking = AgentDefinition(
    id="anthropic_t.thinking",
    system_prompt="Think before answering.",
    allowed_tools=["anthropic_lookup"],
    default_provider="anthropic",
    default_model="claude-test",
    provider_options={"thinking_budget": 2048},
)

stall = AgentDefinition(
    id="anthropic_t.stall",
    default_provider="anthropic",
    default_model="claude-test",
    # longer than any gap in a healthy reply on a loaded machine (a 0.5 s watchdog fired on those), and than
    # a cancel takes to reach the worker; the stall tests wait this long once
    provider_options={"stall_timeout_s": 5.0},
)

no_cache = AgentDefinition(
    id="anthropic_t.no_cache",
    system_prompt="No cache markers here.",
    allowed_tools=["anthropic_lookup"],
    default_model="anthropic/claude-shorthand",
    provider_options={"cache": False},
)

# runs on the scripted provider unless the caller picks another provider/model for the turn
override = AgentDefinition(
    id="anthropic_t.override",
    allow_runtime_override=True,
    script=[ScriptStep(text="scripted answer")],
)

# no provider or model of its own: STEPQ_PROVIDER / STEPQ_MODEL decide
from_env = AgentDefinition(id="anthropic_t.from_env", system_prompt="env-configured")

# Claude on Vertex AI (the test registers the `anthropic-vertex` provider)
vertex = AgentDefinition(
    id="anthropic_t.vertex",
    allowed_tools=["anthropic_lookup"],
    default_provider="anthropic-vertex",
    default_model="claude-v",
)

one_call = AgentDefinition(
    id="anthropic_t.one_call",
    allowed_tools=["anthropic_lookup", "anthropic_fail"],
    default_provider="anthropic",
    default_model="claude-test",
    parallel_tool_calls=False,  # sent as tool_choice.disable_parallel_tool_use
)
