"""`stepq agents`: the agents the configured modules define, as workers will run them, and with `--explain ID`
one agent's effective definition with where each part came from (its module, another module's override or
extension). Loads STEPQ_AGENT_MODULES only: no Redis, no broker."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.agents.extensions import Explanation
from stepq.agents.registry import AgentRegistry, registry
from stepq.config.settings import Settings
from stepq.errors import UnknownAgentError
from stepq.producer.agent_card import picker_fields
from stepq.producer.failures import err

INDENT = "  "
NAME_WIDTH = 20


def cmd_agents(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.agent_modules:
        err("no STEPQ_AGENT_MODULES set: no agents to list")
    agents = registry()
    agents.load_modules(settings.agent_modules)  # overrides and extensions warn on stderr as they are applied
    if args.explain:
        explanation = agents.explain(args.explain)
        if explanation is None:
            known = ", ".join(agents.ids()) or "none"
            raise UnknownAgentError(f"unknown agent {args.explain!r}; known agents: {known}")
        if args.json:
            print(json.dumps(explain_json(agents, explanation), indent=2))
        else:
            print("\n".join(explain_lines(agents, explanation)))
        return 0
    if args.json:
        print(json.dumps(list_json(agents, settings), indent=2))
    else:
        print("\n".join(list_lines(agents, settings)))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("agents", help="the agents of STEPQ_AGENT_MODULES, overrides and extensions applied")
    p.add_argument("--explain", metavar="ID", help="one agent's effective definition and where each part came from")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    p.set_defaults(func=cmd_agents)


# --------------------------------------------------------------------------- the list


def list_json(agents: AgentRegistry, settings: Settings) -> dict[str, Any]:
    listed = []
    for agent_id in agents.ids():
        agent = agents.get(agent_id)
        if agent is not None:
            listed.append(
                {
                    "id": agent.id,
                    "description": agent.description,
                    "execution_mode": agent.execution_mode,
                    "tools": [t.name for t in agent.visible_tools()],
                    "suggestions": [s.model_dump() for s in agent.suggestions],
                    **picker_fields(agent, settings),
                }
            )
    disabled = [{"id": agent_id, "disabled_by": module} for agent_id, module in sorted(agents.disabled().items())]
    return {"agents": listed, "disabled": disabled}


def list_lines(agents: AgentRegistry, settings: Settings) -> list[str]:
    data = list_json(agents, settings)
    lines = []
    for agent in data["agents"]:
        lines.append(f"{agent['id']}  ({agent['execution_mode']})  tools: {', '.join(agent['tools']) or 'none'}")
        lines.append(f"{INDENT}label: {agent['label']}" + (f"  domain: {agent['domain']}" if agent["domain"] else ""))
        if agent["description"]:
            lines.append(f"{INDENT}{agent['description']}")
        if agent["keywords"]:
            lines.append(f"{INDENT}keywords: {', '.join(agent['keywords'])}")
        if agent["data_capabilities"]:
            lines.append(f"{INDENT}data: {'; '.join(agent['data_capabilities'])}")
        models = ", ".join(agent["allowed_models"]) or "the environment's default (none set)"
        lines.append(f"{INDENT}models: {models}" + ("" if agent["model_choice"] else "  (callers may not choose)"))
        for suggestion in agent["suggestions"]:
            lines.append(f"{INDENT}suggestion: {_suggestion(suggestion['label'], suggestion['prompt'])}")
    for agent in data["disabled"]:
        lines.append(f"{agent['id']}  disabled by {agent['disabled_by']} (agent_overrides)")
    return lines or ["no agents"]


# --------------------------------------------------------------------------- one agent, explained


def _tool_source(agents: AgentRegistry, agent: AgentDefinition, name: str) -> str:
    """Where the function that runs under this name comes from: the agent's `@tool`, or another module's override."""
    definition = agent.tool(name)
    fn = getattr(definition, "fn", None)
    origin = agents.tool_origin(name)
    if origin is not None:
        return f"definition {origin}: {fn.__module__}.{fn.__qualname__}" if fn else f"definition {origin}"
    return f"definition declared in {definition.module}" if definition is not None else "not registered"


def definition_json(agent: AgentDefinition) -> dict[str, Any]:
    """The fields that decide what the model sees and may do, JSON-safe (functions and models left out)."""
    return {
        "id": agent.id,
        "label": agent.label,
        "description": agent.description,
        "keywords": agent.keywords,
        "domain": agent.domain,
        "data_capabilities": agent.data_capabilities,
        "execution_mode": agent.execution_mode,
        "default_provider": agent.default_provider,
        "default_model": agent.default_model,
        "allow_runtime_override": agent.allow_runtime_override,
        "read_only": agent.read_only,
        "mutation_policy": agent.mutation_policy,
        "required_features": agent.required_features,
        "loop": agent.loop.model_dump(mode="json", exclude_none=True),
        "system_prompt": agent.system_prompt,
        "prompt_sections": agent.prompt_sections,
        "instructions": agent.instructions,
        "allowed_tools": agent.allowed_tools,
        "shown_tools": [t.name for t in agent.visible_tools()],
        "mcp_tools": [t.definition().name for t in agent.mcp_tools],
        "active_tools": agent.active_tools,
        "tool_choice": agent.tool_choice,
        "suggestions": [s.model_dump() for s in agent.suggestions],
        "task_plan": agent.task_plan,
    }


def explain_json(agents: AgentRegistry, explanation: Explanation) -> dict[str, Any]:
    agent = explanation.agent
    parts = []
    for part in explanation.parts:
        entry = part.as_dict()
        if part.kind == "tool" and not part.removed:
            origin = agents.tool_origin(part.name)
            definition = agent.tool(part.name) if agent is not None else None
            declared = {"action": "declared", "module": getattr(definition, "module", None), "via": "tool"}
            entry["tool_definition"] = origin.as_dict() if origin else declared
        parts.append(entry)
    return {
        "id": explanation.agent_id,
        "disabled_by": agents.disabled().get(explanation.agent_id),
        "definition": definition_json(agent) if agent is not None else None,
        "parts": parts,
    }


def _row(name: str, text: str, removed: bool = False) -> str:
    label = f"- {name}" if removed else name
    return f"{INDENT}{label:<{NAME_WIDTH}} {text}"


def _suggestion(label: str, prompt: str) -> str:
    return json.dumps(label) if prompt == label else f"{json.dumps(label)} -> {json.dumps(prompt)}"


def _quoted(text: str) -> list[str]:
    return [f"{INDENT * 3}| {line}" for line in text.splitlines() or [""]]


def explain_lines(agents: AgentRegistry, explanation: Explanation) -> list[str]:
    agent = explanation.agent
    kept = [p for p in explanation.parts if not p.removed]
    removed = [p for p in explanation.parts if p.removed]
    lines = [f"agent {explanation.agent_id}"]
    lines += [_row("definition", str(p.origin), p.removed) for p in explanation.parts if p.kind == "definition"]
    if agent is None:
        lines.append(f"{INDENT}disabled: submits to it are refused, and no extension brings it back")
        return lines
    model = "/".join(x for x in (agent.default_provider, agent.default_model) if x) or "the environment's default"
    loop = agent.loop.model_dump(mode="json", exclude_none=True, exclude_defaults=True) or {"max_steps": 10}
    lines += [
        _row("description", agent.description or "-"),
        _row("mode", agent.execution_mode),
        _row("model", model + (" (callers may choose)" if agent.allow_runtime_override else "")),
        _row("loop", json.dumps(loop, separators=(", ", ": "))),
        _row("writes", f"read_only={agent.read_only}, mutation_policy={agent.mutation_policy}"),
        _row("features", ", ".join(agent.required_features) or "-"),
    ]
    lines += [_row("task plan", f"{p.name}, {p.origin}") for p in kept if p.kind == "task_plan"]
    lines.append("system prompt")
    texts = {"system_prompt": agent.system_prompt, **agent.prompt_sections}
    for part in [p for p in kept if p.kind in ("system_prompt", "section")]:
        lines.append(_row(part.name if part.kind == "system_prompt" else f"[{part.name}]", str(part.origin)))
        lines += _quoted(texts.get(part.name, "")) if texts.get(part.name) else []
    lines += [_row(f"[{p.name}]", str(p.origin), removed=True) for p in removed if p.kind == "section"]
    if agent.task_plan:
        lines.append(_row("(plan guidance)", "added by task_plan"))
    lines.append("tools")
    shown = {t.name for t in agent.visible_tools()}
    for part in [p for p in kept if p.kind == "tool"]:
        hidden = "" if part.name in shown else "; hidden: a write tool and writes are off"
        lines.append(_row(part.name, f"{part.origin}; {_tool_source(agents, agent, part.name)}{hidden}"))
    for tool in agent.mcp_tools:
        lines.append(_row(tool.definition().name, f"MCP tool of server {tool.server.name}"))
    lines += [_row(p.name, str(p.origin), removed=True) for p in removed if p.kind == "tool"]
    lines.append("suggestions")
    prompts = {s.label: s.prompt for s in agent.suggestions}
    for part in [p for p in kept if p.kind == "suggestion"]:
        lines.append(_row(_suggestion(part.name, prompts.get(part.name, part.name)), str(part.origin)))
    lines += [_row(json.dumps(p.name), str(p.origin), removed=True) for p in removed if p.kind == "suggestion"]
    return lines
