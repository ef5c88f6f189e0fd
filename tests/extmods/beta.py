"""Patches `catalog` where import order would matter if patches ran module by module: it replaces the tool list
(alpha's appended tool must survive) and appends a suggestion (after alpha's, by module name). It also tries to
bring back the agent alpha disabled, and extends an agent nobody declares."""

from __future__ import annotations

from stepq import AgentExtension

tighten = AgentExtension(
    target="ext.catalog",
    replace_allowed_tools=["ext_lookup"],
    replace_prompt_sections={"tone": "Be brief and cite the product id."},
    append_suggestions=["Compare products"],
    task_plan=True,
)

resurrect = AgentExtension(target="ext.retired", append_prompt_sections={"back": "I am back."})

nowhere = AgentExtension(target="ext.nowhere", append_allowed_tools=["ext_stats"])
