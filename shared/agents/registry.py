"""The agent registry: agents by id, loaded from `STEPQ_AGENT_MODULES`, each module's own agents with the
other modules' overrides and extensions applied (`stepq.agents.extensions`), whatever order they load in.

Its own module because it sits above both the definitions and the extensions it resolves.
"""

from __future__ import annotations

import importlib
import logging

from pydantic import ValidationError

from stepq.agents.definition import AgentDefinition, check_agent
from stepq.agents.extensions import Explanation, ModuleExports, Origin, Resolution, first_error, resolve
from stepq.agents.tools import declared_tools, set_tool_overrides, tool_overrides
from stepq.errors import DefinitionError
from stepq.providers.registry import split_shorthand

REGISTERED = "(registered)"  # the provenance of agents given to AgentRegistry.register rather than found in a module
log = logging.getLogger("stepq.agents")


class AgentRegistry:
    """Agents by id, loaded from modules: their own agents with the other modules' overrides and extensions
    applied (stepq.agents.extensions), whatever order the modules load in. Loading validates every effective agent."""

    def __init__(self) -> None:
        self._modules: dict[str, ModuleExports] = {}
        self._registered: dict[str, AgentDefinition] = {}
        self._resolution = Resolution({}, {}, {}, {}, {}, [])
        self._checked: dict[int, AgentDefinition] = {}  # by id(); holds the object so its id is not reused
        self._warned: set[str] = set()

    def register(self, agent: AgentDefinition) -> None:
        """Add one agent outside any module (its provenance reads `(registered)`)."""
        existing = self._registered.get(agent.id) or self._declared(agent.id)
        if existing is not None and existing is not agent:
            raise DefinitionError(f"agent {agent.id!r} is defined twice")
        registered = {**self._registered, agent.id: agent}
        self._apply(self._modules, registered)
        self._registered = registered

    def load_modules(self, modules: list[str]) -> None:
        """Import these modules and recompute the effective agents of every module loaded so far."""
        new: dict[str, ModuleExports] = {}
        for name in modules:
            if name in self._modules or name in new:
                continue
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                raise DefinitionError(f"cannot import agent module {name!r}: {exc}") from exc
            except ValidationError as exc:  # a definition's field of the wrong type: one line, not a traceback
                raise DefinitionError(f"agent module {name!r}: {exc.title} {first_error(exc)}") from None
            new[name] = ModuleExports.of(module, AgentDefinition)
        if new:
            every = {**self._modules, **new}
            self._apply(every, self._registered)
            self._modules = every

    def _declared(self, agent_id: str) -> AgentDefinition | None:
        for exports in self._modules.values():
            for agent in exports.agents:
                if agent.id == agent_id:
                    return agent
        return None

    def _apply(self, modules: dict[str, ModuleExports], registered: dict[str, AgentDefinition]) -> None:
        """Resolve, set the tool overrides, check every new or patched agent; on a refusal nothing changes."""
        exports = [*modules.values()]
        if registered:
            exports.append(ModuleExports(REGISTERED, tuple(registered.values())))
        resolution = resolve(exports, declared_tools())
        before = tool_overrides()
        after = {**before, **resolution.tool_overrides}
        if after.keys() != before.keys() or any(after[k] is not v for k, v in before.items()):
            self._checked.clear()  # an agent's tools changed under it: check every agent again
        set_tool_overrides(after)
        try:
            for agent_id, agent in resolution.agents.items():
                agent.bind_tools(resolution.tool_modules.get(agent_id, {}))
                if id(agent) not in self._checked:
                    check_agent(agent)
        except Exception:
            set_tool_overrides(before)
            raise
        self._checked = {id(agent): agent for agent in resolution.agents.values()}
        for message in resolution.warnings:
            if message not in self._warned:
                self._warned.add(message)
                log.warning(message)
        self._resolution = resolution

    def get(self, agent_id: str) -> AgentDefinition | None:
        """The effective agent (None when unknown or disabled by an override)."""
        return self._resolution.agents.get(agent_id)

    def ids(self) -> list[str]:
        return sorted(self._resolution.agents)

    def named_providers(self) -> list[str]:
        """Every provider an effective agent names, as its default or a fallback."""
        named: dict[str, None] = {}
        for agent in self._resolution.agents.values():
            provider, _ = split_shorthand(agent.default_provider, agent.default_model)
            for name in (provider, *(f.provider for f in agent.fallbacks)):
                if name:
                    named[name] = None
        return list(named)

    def disabled(self) -> dict[str, str]:
        """Agents an override disabled: id -> the module that did."""
        return dict(self._resolution.disabled)

    def explain(self, agent_id: str) -> Explanation | None:
        """The effective definition and where each of its parts came from (None when no module declares it)."""
        return self._resolution.explanations.get(agent_id)

    def tool_origin(self, name: str) -> Origin | None:
        """Which module replaced or disabled this tool (None: it is as declared)."""
        return self._resolution.tool_origins.get(name)

    def warnings(self) -> list[str]:
        """What loading skipped: overrides and extensions whose targets are missing."""
        return list(self._resolution.warnings)


_REGISTRY = AgentRegistry()


def registry() -> AgentRegistry:
    return _REGISTRY
