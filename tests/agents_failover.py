"""Agents for the failover tests (tests/test_failover.py): a primary that keeps failing before any content
and the fallbacks a step moves to. The Anthropic side is the local fake Messages API."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall


@tool
def failover_lookup(query: str) -> dict[str, str]:
    """Look a query up and return its answer."""
    return {"answer": f"result for {query}"}


# Anthropic first; when its attempts are spent before content, the scripted provider answers (a tool, then text)
to_scripted = AgentDefinition(
    id="failover_t.to_scripted",
    allowed_tools=["failover_lookup"],
    default_provider="anthropic",
    default_model="claude-primary",
    fallbacks=["scripted/backup"],
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="failover_lookup", args={"query": "x"}, id="call_fb")]),
        ScriptStep(text="answered by the fallback", echo_messages=True),
    ],
)

# the scripted provider keeps failing with 529 on step 0; Anthropic (the fake) takes over for the rest
to_anthropic = AgentDefinition(
    id="failover_t.to_anthropic",
    system_prompt="Fallback test.",
    allowed_tools=["failover_lookup"],
    default_provider="scripted",
    default_model="primary",
    fallbacks=[{"provider": "anthropic", "model": "claude-backup"}],
    script=[ScriptStep(text="never", fail=ScriptFailure(status=529, message="overloaded", times=1000))],
)

# no fallbacks of its own: STEPQ_FALLBACKS decides
operator = AgentDefinition(
    id="failover_t.operator",
    default_provider="anthropic",
    default_model="claude-primary",
    script=[ScriptStep(text="answered by the operator's fallback")],
)

# Anthropic first, OpenAI (the fake Responses API) when Anthropic keeps failing
to_openai = AgentDefinition(
    id="failover_t.to_openai",
    allowed_tools=["failover_lookup"],
    default_provider="anthropic",
    default_model="claude-primary",
    fallbacks=[{"provider": "openai", "model": "gpt-backup"}],
)
