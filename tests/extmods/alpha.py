"""Patches `catalog`: a faster ext_lookup (tool override), metrics in place of the legacy section, one suggestion
out and one in; disables ext.retired."""

from __future__ import annotations

from stepq import AgentExtension, tool


@tool
def ext_stats() -> dict[str, int]:
    """Catalog metrics."""
    return {"products": 42}


@tool
def ext_fast_lookup(q: str) -> dict[str, str]:
    """Look a product up (the faster lookup)."""
    return {"source": "alpha", "q": q}


tool_overrides = {"ext_lookup": ext_fast_lookup}
agent_overrides = {"ext.retired": None}

metrics = AgentExtension(
    target="ext.catalog",
    append_allowed_tools=["ext_stats"],
    delete_prompt_sections=["legacy"],
    append_prompt_sections={"stats": "Use ext_stats for catalog metrics."},
    delete_suggestions=["Old stats"],
    append_suggestions=["Show catalog stats"],
)
