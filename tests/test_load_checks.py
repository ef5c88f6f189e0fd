"""Tool schemas a provider cannot take are refused when the agent is loaded, not at call time."""

from __future__ import annotations

import pytest

from stepq.agents.definition import AgentDefinition
from stepq.agents.registry import AgentRegistry
from stepq.agents.tools import tool
from stepq.errors import DefinitionError


@tool(name="lc bad name!")
def lc_bad_name(x: str) -> str:
    """A tool whose name Bedrock and Anthropic reject."""
    return x


@tool
def lc_fine(x: str) -> str:
    """A tool every provider accepts."""
    return x


@pytest.mark.parametrize("provider", ["bedrock", "anthropic"])
def test_unexpressible_tool_name_is_refused_at_load(provider):
    agent = AgentDefinition(id="lc.bad", allowed_tools=["lc bad name!"], default_provider=provider, default_model="m")
    with pytest.raises(DefinitionError) as err:
        AgentRegistry().register(agent)
    assert "lc bad name!" in str(err.value)


@pytest.mark.parametrize("provider", ["bedrock", "anthropic", "scripted"])
def test_expressible_tools_load(provider):
    agent = AgentDefinition(id="lc.fine", allowed_tools=["lc_fine"], default_provider=provider, default_model="m")
    AgentRegistry().register(agent)


@tool
def lc_free_form(labels: dict[str, str]) -> str:
    """Takes a free-form mapping, which Gemini's schema subset cannot declare."""
    return ",".join(labels)


def test_gemini_refuses_a_schema_it_cannot_take_at_load():
    agent = AgentDefinition(id="lc.gem", allowed_tools=["lc_free_form"], default_provider="gemini", default_model="m")
    with pytest.raises(DefinitionError) as err:
        AgentRegistry().register(agent)
    assert "lc_free_form" in str(err.value)
