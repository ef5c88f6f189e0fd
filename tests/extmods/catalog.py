"""The base module: an agent with prompt sections, tools and suggestions for `alpha` and `beta` to patch, and
one (`ext.retired`) that `alpha` disables and `beta` tries to extend."""

from __future__ import annotations

import json

from stepq import (
    AgentDefinition,
    FunctionModel,
    FunctionRequest,
    FunctionResponse,
    ScriptToolCall,
    Suggestion,
    tool,
)


@tool
def ext_lookup(q: str) -> dict[str, str]:
    """Look a product up (the catalog's own lookup)."""
    return {"source": "catalog", "q": q}


@tool
def ext_old_stats() -> dict[str, int]:
    """Catalog metrics, the old way."""
    return {"products": 0}


def _report(request: FunctionRequest) -> FunctionResponse | str:
    """Call ext_lookup once, then answer with what this step was shown: its system text, tools and results."""
    if "ext_lookup" not in request.called and any(t.name == "ext_lookup" for t in request.tools):
        return FunctionResponse(tool_calls=[ScriptToolCall(name="ext_lookup", args={"q": "mugs"})])
    shown = {"system": request.system, "tools": [t.name for t in request.tools], "results": request.tool_results}
    return json.dumps(shown)


catalog = AgentDefinition(
    id="ext.catalog",
    description="Answers catalog questions.",
    system_prompt="You answer catalog questions.",
    prompt_sections={"tone": "Be brief.", "legacy": "Use ext_old_stats for metrics."},
    allowed_tools=["ext_lookup", "ext_old_stats"],
    suggestions=[Suggestion(label="Old stats", prompt="Show the old stats"), "Find a product"],
    function_model=FunctionModel(_report),
)

retired = AgentDefinition(id="ext.retired", system_prompt="Retired.", function_model=FunctionModel(_report))
