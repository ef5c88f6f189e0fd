"""Overrides and extensions: one module changes another module's agents and tools, the same way whatever
order the modules load in.

Besides its own agents and tools, a module listed in STEPQ_AGENT_MODULES may export:

- `agent_overrides = {"crm.assistant": AgentDefinition(id="crm.assistant", ...) | None}`: replace another
  module's agent with a whole definition, or disable it (None);
- `tool_overrides = {"lookup_order": faster_lookup | None}`: run another `@tool` (its function, schema and
  policy) under that name, or disable the tool (None: no agent shows it);
- module-level `AgentExtension(target="crm.assistant", ...)`s: patch an agent's tool list, prompt sections,
  suggestions and task plan without copying the rest of it.

The effective agents are computed from every loaded module at once (`resolve`): the declared agents, then
the overrides, then the extensions in three phases over all the extensions of an agent: every replace, then
every delete, then every append (appends in order of module name, then position in the module). Nothing
depends on the order the modules were imported in: two modules replacing the same thing are refused at load,
since no order could settle it. A target that is not there is skipped with a warning, and an extension never
brings a disabled agent back. Each part of an effective agent keeps where it came from (`Origin`), which
`stepq agents --explain ID` prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stepq.agents.definition import AgentDefinition
from stepq.agents.prompt_parts import Suggestion, check_section_names
from stepq.agents.task_plan import PLAN_TOOL
from stepq.agents.tools import ToolDefinition
from stepq.errors import DefinitionError

AGENT_OVERRIDES = "agent_overrides"
TOOL_OVERRIDES = "tool_overrides"


class AgentExtension(BaseModel):
    """A patch to another module's agent, declared at module level in a module of STEPQ_AGENT_MODULES.

    Applied after `agent_overrides`, in three phases over every extension of the agent: `replace_*` (and
    `task_plan`) first, `delete_*` second, `append_*` last."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    target: str
    """The agent's id; a missing (or disabled) agent is skipped with a warning."""
    replace_allowed_tools: list[str] | None = None
    """The whole tool whitelist instead of the agent's."""
    delete_allowed_tools: list[str] = Field(default_factory=list)
    """Tool names removed from the whitelist."""
    append_allowed_tools: list[str] = Field(default_factory=list)
    """Tool names added at the end of the whitelist (registered `@tool`s)."""
    replace_system_prompt: str | None = None
    """The agent's `system_prompt` (its sections stay)."""
    replace_prompt_sections: dict[str, str] = Field(default_factory=dict)
    """New text for named sections of the agent, each kept in its place."""
    delete_prompt_sections: list[str] = Field(default_factory=list)
    """Names of sections removed."""
    append_prompt_sections: dict[str, str] = Field(default_factory=dict)
    """Named sections added after the agent's, in this order."""
    replace_suggestions: list[Suggestion] | None = None
    """The whole list of starter prompts."""
    delete_suggestions: list[str] = Field(default_factory=list)
    """Starter prompts removed, by label or by prompt."""
    append_suggestions: list[Suggestion] = Field(default_factory=list)
    """Starter prompts added at the end (a label already there is kept as it was)."""
    task_plan: bool | None = None
    """Turn the agent's visible task plan on or off (None: leave it)."""

    @field_validator("replace_allowed_tools", "append_allowed_tools")
    @classmethod
    def _no_plan_tool(cls, value: list[str] | None) -> list[str] | None:
        if value and PLAN_TOOL in value:
            raise ValueError(f"{PLAN_TOOL!r} comes with task_plan=True; do not list it")
        return value

    @model_validator(mode="after")
    def _check_sections(self) -> AgentExtension:
        for names in (self.replace_prompt_sections, self.delete_prompt_sections, self.append_prompt_sections):
            check_section_names(names, f"extension of {self.target}")
        return self


# --------------------------------------------------------------------------- provenance

Action = Literal["declared", "replaced", "deleted", "appended", "disabled", "set"]
Via = Literal["definition", "agent_overrides", "tool_overrides", "extension", "tool"]
PartKind = Literal["definition", "system_prompt", "section", "tool", "tool_definition", "suggestion", "task_plan"]


@dataclass(frozen=True)
class Origin:
    """Where one part of an effective agent came from: which module did what to it, through which export."""

    action: Action
    module: str
    via: Via = "definition"

    def __str__(self) -> str:
        where = f"{self.action} {'in' if self.action == 'declared' else 'by'} {self.module}"
        return where if self.via in ("definition", "tool") else f"{where} ({self.via})"

    def as_dict(self) -> dict[str, str]:
        return {"action": self.action, "module": self.module, "via": self.via}


@dataclass(frozen=True)
class Part:
    """One part of an agent (its definition, prompt, a section, a tool, a suggestion, its task plan)."""

    kind: PartKind
    name: str
    origin: Origin
    removed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "removed": self.removed, **self.origin.as_dict()}


@dataclass
class Explanation:
    """An agent's effective definition (None when disabled) and where each of its parts came from."""

    agent_id: str
    agent: AgentDefinition | None
    parts: list[Part]


# --------------------------------------------------------------------------- what modules declare


@dataclass(frozen=True)
class ModuleExports:
    """What one agent module declares: agents, overrides of others' agents and tools, extensions."""

    name: str
    agents: tuple[AgentDefinition, ...] = ()
    agent_overrides: Mapping[str, AgentDefinition | None] = field(default_factory=dict)
    tool_overrides: Mapping[str, ToolDefinition | None] = field(default_factory=dict)
    extensions: tuple[AgentExtension, ...] = ()
    tools: Mapping[str, ToolDefinition] = field(default_factory=dict)  # declared or imported here, by tool name

    @classmethod
    def of(cls, module: ModuleType, agent_type: type[AgentDefinition]) -> ModuleExports:
        name = module.__name__
        names = vars(module)
        agent_overrides = _mapping(names.get(AGENT_OVERRIDES, {}), agent_type, name, AGENT_OVERRIDES)
        tool_overrides = _mapping(names.get(TOOL_OVERRIDES, {}), ToolDefinition, name, TOOL_OVERRIDES)
        replacements = {id(v) for v in agent_overrides.values() if v is not None}
        agents = tuple(v for v in names.values() if isinstance(v, agent_type) and id(v) not in replacements)
        extensions = tuple(v for v in names.values() if isinstance(v, AgentExtension))
        tools = _module_tools(name, [v for v in names.values() if isinstance(v, ToolDefinition)])
        return cls(name, agents, agent_overrides, tool_overrides, extensions, tools)


def _module_tools(module: str, found: list[ToolDefinition]) -> dict[str, ToolDefinition]:
    """The tool a module means by each name: the one it declares, else the one it imports. Importing two
    modules' tools of one name (and declaring none) leaves no way to tell which one its agents mean."""
    tools: dict[str, ToolDefinition] = {}
    for definition in sorted(found, key=lambda t: t.module != module):  # its own declarations first
        known = tools.get(definition.name)
        if known is None:
            tools[definition.name] = definition
        elif known.module != module and known.fn is not definition.fn:
            raise DefinitionError(
                f"module {module}: imports two tools named {definition.name!r}, declared in {known.module} and "
                f"{definition.module}; import one of them"
            )
    return tools


def _mapping(value: Any, kind: type, module: str, export: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and (v is None or isinstance(v, kind)) for k, v in value.items()
    ):
        raise DefinitionError(f"module {module}: {export} must map names to a {kind.__name__} or None (disable)")
    return dict(value)


# --------------------------------------------------------------------------- resolution


@dataclass
class Resolution:
    """The effective agents and tools of a set of modules, with their provenance and the warnings on the way."""

    agents: dict[str, AgentDefinition]
    explanations: dict[str, Explanation]
    disabled: dict[str, str]  # agent id -> the module that disabled it
    tool_overrides: dict[str, ToolDefinition | None]
    tool_origins: dict[str, Origin]  # only the tools some module replaced or disabled
    warnings: list[str]
    tool_modules: dict[str, dict[str, str]] = field(default_factory=dict)  # agent id -> tool name -> declarer


@dataclass
class _Draft:
    """An agent being patched: each list or map keeps its parts' origins beside their values."""

    base: AgentDefinition
    origin: Origin
    system_prompt: tuple[str, Origin]
    sections: dict[str, tuple[str, Origin]]
    tools: dict[str, Origin]
    suggestions: list[tuple[Suggestion, Origin]]
    task_plan: tuple[bool, Origin]
    removed: list[Part] = field(default_factory=list)
    changed: bool = False

    @classmethod
    def of(cls, agent: AgentDefinition, origin: Origin) -> _Draft:
        return cls(
            base=agent,
            origin=origin,
            system_prompt=(agent.system_prompt, origin),
            sections={name: (text, origin) for name, text in agent.prompt_sections.items()},
            tools=dict.fromkeys(agent.allowed_tools, origin),
            suggestions=[(s, origin) for s in agent.suggestions],
            task_plan=(agent.task_plan, origin),
        )

    def remove(self, kind: PartKind, name: str, origin: Origin) -> None:
        self.removed.append(Part(kind, name, origin, removed=True))
        self.changed = True

    def build(self) -> AgentDefinition:
        if not self.changed:
            return self.base
        agent = self.base
        tools = list(self.tools)
        values = {name: getattr(agent, name) for name in agent.model_fields_set}
        values.update(
            system_prompt=self.system_prompt[0],
            prompt_sections={name: text for name, (text, _) in self.sections.items()},
            allowed_tools=tools,
            suggestions=[s for s, _ in self.suggestions],
            task_plan=self.task_plan[0],
        )
        if agent.active_tools is not None:
            values["active_tools"] = [name for name in agent.active_tools if name in self.tools]
        try:
            return type(agent)(**values)
        except ValidationError as exc:
            raise DefinitionError(f"agent {agent.id} after its extensions: {first_error(exc)}") from None

    def parts(self) -> list[Part]:
        out = [
            Part("definition", self.base.id, self.origin),
            Part("system_prompt", "system_prompt", self.system_prompt[1]),
        ]
        out += [Part("section", name, origin) for name, (_, origin) in self.sections.items()]
        out += [Part("tool", name, origin) for name, origin in self.tools.items()]
        out += [Part("suggestion", s.label, origin) for s, origin in self.suggestions]
        out.append(Part("task_plan", "on" if self.task_plan[0] else "off", self.task_plan[1]))
        return out + self.removed


def first_error(exc: ValidationError) -> str:
    """A validation error as one line: where, then what (the first problem; fixing it shows the next)."""
    error = exc.errors()[0]
    where = ".".join(str(x) for x in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def resolve(modules: Iterable[ModuleExports], declared_tools: Mapping[str, Mapping[str, ToolDefinition]]) -> Resolution:
    """The effective agents of these modules; raises DefinitionError on a conflict no order could settle.
    `declared_tools`: tool name -> declaring module -> definition."""
    ordered = sorted(modules, key=lambda m: m.name)
    warnings: list[str] = []
    declared = _declared_agents(ordered)
    drafts, disabled = _apply_agent_overrides(ordered, declared, warnings)
    tool_overrides, tool_origins = _tool_overrides(ordered, declared_tools, warnings)
    _apply_extensions(ordered, drafts, disabled, warnings)
    for draft in drafts.values():
        for name, origin in tool_origins.items():
            if tool_overrides[name] is None and name in draft.tools:
                del draft.tools[name]
                draft.remove("tool", name, origin)
    agents = {agent_id: draft.build() for agent_id, draft in drafts.items()}
    explanations = {agent_id: Explanation(agent_id, agents[agent_id], drafts[agent_id].parts()) for agent_id in drafts}
    for agent_id, module in disabled.items():
        off = Part("definition", agent_id, Origin("disabled", module, "agent_overrides"), removed=True)
        explanations[agent_id] = Explanation(agent_id, None, [Part("definition", agent_id, declared[agent_id][1]), off])
    by_name = {m.name: m for m in ordered}
    tool_modules = {
        agent_id: _tool_modules(agent_id, draft, by_name, declared_tools) for agent_id, draft in drafts.items()
    }
    return Resolution(agents, explanations, disabled, tool_overrides, tool_origins, warnings, tool_modules)


def _tool_modules(
    agent_id: str,
    draft: _Draft,
    modules: Mapping[str, ModuleExports],
    declared_tools: Mapping[str, Mapping[str, ToolDefinition]],
) -> dict[str, str]:
    """Which module's tool each of an agent's tool names runs: the one the module that listed the name (the
    agent's, an override's or an extension's) declares or imports, else the only module declaring that name."""
    bound: dict[str, str] = {}
    for name, origin in draft.tools.items():
        lister = modules.get(origin.module)
        seen = lister.tools.get(name) if lister is not None else None
        declarers = sorted(declared_tools.get(name, {}))
        if seen is not None:
            bound[name] = seen.module
        elif len(declarers) == 1:
            bound[name] = declarers[0]
        elif declarers:
            raise DefinitionError(
                f"agent {agent_id}: tool {name!r} is declared in both {declarers[0]} and {declarers[1]}; "
                f"{origin.module} must declare or import the one it means"
            )
    return bound


def _declared_agents(modules: list[ModuleExports]) -> dict[str, tuple[AgentDefinition, Origin]]:
    declared: dict[str, tuple[AgentDefinition, Origin]] = {}
    for module in modules:
        for agent in module.agents:
            known = declared.get(agent.id)
            if known is None:
                declared[agent.id] = (agent, Origin("declared", module.name))
            elif known[0] is not agent:  # the same object imported into another module is one agent
                raise DefinitionError(
                    f"agent {agent.id!r} is defined twice (in {known[1].module} and {module.name}); "
                    f"to replace it, put the new one in {AGENT_OVERRIDES}"
                )
    return declared


def _owners(modules: list[ModuleExports], pick: str) -> dict[str, tuple[str, Any]]:
    """target -> (module, value) of an override export; two modules overriding one target differently is refused."""
    owners: dict[str, tuple[str, Any]] = {}
    for module in modules:
        for target, value in getattr(module, pick).items():
            known = owners.get(target)
            if known is not None and known[1] is not value:
                raise DefinitionError(
                    f"{target!r} is overridden by both {known[0]} and {module.name} ({pick}); keep one override"
                )
            owners.setdefault(target, (module.name, value))
    return owners


def _apply_agent_overrides(
    modules: list[ModuleExports], declared: dict[str, tuple[AgentDefinition, Origin]], warnings: list[str]
) -> tuple[dict[str, _Draft], dict[str, str]]:
    drafts = {agent_id: _Draft.of(agent, origin) for agent_id, (agent, origin) in declared.items()}
    disabled: dict[str, str] = {}
    for target, (module, replacement) in _owners(modules, AGENT_OVERRIDES).items():
        if target not in declared:
            warnings.append(f"{AGENT_OVERRIDES} in {module}: no agent {target!r} to replace or disable; skipped")
            continue
        if replacement is None:
            disabled[target] = module
            del drafts[target]
            continue
        if replacement.id != target:
            raise DefinitionError(
                f"{AGENT_OVERRIDES} in {module}: {target!r} is replaced by an agent with id {replacement.id!r}"
            )
        drafts[target] = _Draft.of(replacement, Origin("replaced", module, "agent_overrides"))
    return drafts, disabled


def _tool_overrides(
    modules: list[ModuleExports], declared_tools: Mapping[str, Mapping[str, ToolDefinition]], warnings: list[str]
) -> tuple[dict[str, ToolDefinition | None], dict[str, Origin]]:
    overrides: dict[str, ToolDefinition | None] = {}
    origins: dict[str, Origin] = {}
    for target, (module, replacement) in _owners(modules, TOOL_OVERRIDES).items():
        if target not in declared_tools:
            warnings.append(f"{TOOL_OVERRIDES} in {module}: no tool {target!r} to replace or disable; skipped")
            continue
        if replacement is None:
            overrides[target] = None
            origins[target] = Origin("disabled", module, "tool_overrides")
        else:  # the replacement's function, schema and policy, under the name the agents list
            overrides[target] = dataclasses.replace(replacement, name=target, _validator=None)
            origins[target] = Origin("replaced", module, "tool_overrides")
    return overrides, origins


_SETTERS = ("replace_allowed_tools", "replace_system_prompt", "replace_suggestions", "task_plan")


def _apply_extensions(
    modules: list[ModuleExports], drafts: dict[str, _Draft], disabled: dict[str, str], warnings: list[str]
) -> None:
    by_target: dict[str, list[tuple[str, AgentExtension]]] = {}
    seen: set[int] = set()
    for module in modules:
        for ext in module.extensions:
            if id(ext) in seen:  # imported into another module too: one extension, of the first module by name
                continue
            seen.add(id(ext))
            if ext.target in disabled:
                warnings.append(
                    f"extension in {module.name}: agent {ext.target!r} is disabled by {disabled[ext.target]}; skipped"
                )
            elif ext.target not in drafts:
                warnings.append(f"extension in {module.name}: no agent {ext.target!r} to extend; skipped")
            else:
                by_target.setdefault(ext.target, []).append((module.name, ext))
    for target, exts in by_target.items():
        _refuse_conflicts(target, exts)
        draft = drafts[target]
        for owner, ext in exts:
            _replace(draft, owner, ext, warnings)
        present = (set(draft.tools), set(draft.sections), list(draft.suggestions))
        for owner, ext in exts:
            _delete(draft, owner, ext, present, warnings)
        for owner, ext in exts:
            _append(draft, owner, ext)


def _refuse_conflicts(target: str, exts: list[tuple[str, AgentExtension]]) -> None:
    """Two extensions replacing the same part of one agent: whichever won would depend on an arbitrary order."""
    seen: dict[str, str] = {}

    def claim(part: str, module: str) -> None:
        if part in seen:
            raise DefinitionError(
                f"agent {target}: extensions in {seen[part]} and {module} both set {part}; keep one of them"
            )
        seen[part] = module

    for module, ext in exts:
        for name in _SETTERS:
            if getattr(ext, name) is not None:
                claim(name, module)
        for name in ext.replace_prompt_sections:
            claim(f"replace_prompt_sections[{name!r}]", module)
        for name in ext.append_prompt_sections:
            claim(f"append_prompt_sections[{name!r}]", module)


def _replace(draft: _Draft, module: str, ext: AgentExtension, warnings: list[str]) -> None:
    origin = Origin("replaced", module, "extension")
    if ext.replace_allowed_tools is not None:
        for name in draft.tools:
            if name not in ext.replace_allowed_tools:
                draft.remove("tool", name, origin)
        draft.tools = dict.fromkeys(ext.replace_allowed_tools, origin)
        draft.changed = True
    if ext.replace_system_prompt is not None:
        draft.system_prompt = (ext.replace_system_prompt, origin)
        draft.changed = True
    for name, text in ext.replace_prompt_sections.items():
        if name not in draft.sections:
            warnings.append(
                f"extension in {module}: agent {ext.target} has no prompt section {name!r} to replace; skipped"
            )
            continue
        draft.sections[name] = (text, origin)
        draft.changed = True
    if ext.replace_suggestions is not None:
        draft.removed += [Part("suggestion", s.label, origin, removed=True) for s, _ in draft.suggestions]
        draft.suggestions = [(s, origin) for s in ext.replace_suggestions]
        draft.changed = True
    if ext.task_plan is not None:
        draft.task_plan = (ext.task_plan, Origin("set", module, "extension"))
        draft.changed = True


def _delete(
    draft: _Draft,
    module: str,
    ext: AgentExtension,
    present: tuple[set[str], set[str], list[tuple[Suggestion, Origin]]],
    warnings: list[str],
) -> None:
    """Deletes are checked against the agent as the replaces left it, so two modules may delete one part."""
    origin = Origin("deleted", module, "extension")
    tools, sections, suggestions = present

    def missing(what: str) -> None:
        warnings.append(f"extension in {module}: agent {ext.target} has no {what} to delete; skipped")

    for name in ext.delete_allowed_tools:
        if name not in tools:
            missing(f"tool {name!r}")
        elif draft.tools.pop(name, None) is not None:
            draft.remove("tool", name, origin)
    for name in ext.delete_prompt_sections:
        if name not in sections:
            missing(f"prompt section {name!r}")
        elif draft.sections.pop(name, None) is not None:
            draft.remove("section", name, origin)
    for text in ext.delete_suggestions:
        if not any(s.matches(text) for s, _ in suggestions):
            missing(f"suggestion {text!r}")
            continue
        for s, _ in [x for x in draft.suggestions if x[0].matches(text)]:
            draft.remove("suggestion", s.label, origin)
        draft.suggestions = [x for x in draft.suggestions if not x[0].matches(text)]


def _append(draft: _Draft, module: str, ext: AgentExtension) -> None:
    origin = Origin("appended", module, "extension")
    for name in ext.append_allowed_tools:
        if name not in draft.tools:
            draft.tools[name] = origin
            draft.changed = True
    for name, text in ext.append_prompt_sections.items():
        if name in draft.sections:
            raise DefinitionError(
                f"extension in {module}: agent {ext.target} already has a prompt section {name!r}; "
                "use replace_prompt_sections (or delete it first)"
            )
        draft.sections[name] = (text, origin)
        draft.changed = True
    labels = {s.label for s, _ in draft.suggestions}
    for suggestion in ext.append_suggestions:
        if suggestion.label not in labels:
            labels.add(suggestion.label)
            draft.suggestions.append((suggestion, origin))
            draft.changed = True
