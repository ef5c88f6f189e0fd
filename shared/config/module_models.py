"""Per-module model defaults from the environment: `STEPQ_<MODULE>_PROVIDER` / `STEPQ_<MODULE>_MODEL`.

An agent's module is the part of its id before the dot (`support` in `support.refunds`). An operator points
every agent of a module at another model without touching code: the module's variables come after a caller's
own choice (when the agent allows one) and before the agent's `default_provider` / `default_model`, which in
turn come before the fleet-wide `STEPQ_PROVIDER` / `STEPQ_MODEL`. `STEPQ_SUPPORT_MODEL=anthropic/claude-...`
sets both at once. A provider and its model go together: a module provider needs the module's model too
(except the offline providers, whose model is their own name), so it is never paired with a model id the
agent wrote for another provider. Read and checked when a process starts, like every `STEPQ_*` variable.

Provider names belong to the registry (`stepq.providers.registry`), a layer above configuration, which
installs its `known_providers` here when it is imported (`use_provider_names`); the package facade imports
it, so it is in place before any settings are read. Configuration checks names without importing providers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from pydantic import BaseModel, ConfigDict

_VARIABLE = re.compile(r"^STEPQ_([A-Z][A-Z0-9_]*)_(PROVIDER|MODEL)$")
_OFFLINE = frozenset({"scripted", "function", "test"})  # providers whose model is their own name
_provider_names: Callable[[], Iterable[str]] = tuple  # until the registry installs itself: no name is known


def use_provider_names(names: Callable[[], Iterable[str]]) -> None:
    """Where settings look provider names up: the registry installs its `known_providers` at import."""
    global _provider_names
    _provider_names = names


def known_providers() -> list[str]:
    """Every provider name the registry knows (built in, lazily loaded, registered)."""
    return sorted(_provider_names())


def split_shorthand(provider: str | None, model: str | None) -> tuple[str | None, str | None]:
    """`provider/model` shorthand in the model field fills the provider when it is not given."""
    if model and "/" in model and provider is None:
        head, tail = model.split("/", 1)
        if head in known_providers():
            return head, tail
    return provider, model


class ModuleModel(BaseModel):
    """One module's default provider and/or model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str | None = None
    model: str | None = None


def variable(module: str, axis: str) -> str:
    return f"STEPQ_{module.upper()}_{axis.upper()}"


def from_environ(environ: Mapping[str, str]) -> dict[str, ModuleModel]:
    """Every module's defaults found in the environment; ValueError naming the variable for a bad one."""
    found: dict[str, dict[str, str]] = {}
    for name, value in environ.items():
        match = _VARIABLE.match(name)
        if match is None or not value.strip():
            continue
        found.setdefault(match.group(1).lower(), {})[match.group(2).lower()] = value.strip()
    return check({module: ModuleModel(**axes) for module, axes in found.items()})


def check(models: Mapping[str, ModuleModel]) -> dict[str, ModuleModel]:
    """Refuse an unknown provider, and a provider without its model, naming the variable to fix."""
    known = known_providers()
    for module, choice in models.items():
        provider, model = split_shorthand(choice.provider, choice.model)
        if provider is not None and provider not in known:
            where = variable(module, "provider" if choice.provider else "model")
            raise ValueError(f"{where}: unknown provider {provider!r}; known: {', '.join(known)}")
        if provider is not None and model is None and provider not in _OFFLINE:
            raise ValueError(
                f"{variable(module, 'provider')}={provider} needs {variable(module, 'model')} too: "
                "the agent's own model id may not exist on that provider"
            )
    return dict(models)


def to_env(models: Mapping[str, ModuleModel]) -> dict[str, str]:
    """The variables that give another process the same module defaults."""
    env: dict[str, str] = {}
    for module, choice in models.items():
        if choice.provider:
            env[variable(module, "provider")] = choice.provider
        if choice.model:
            env[variable(module, "model")] = choice.model
    return env


def for_agent(models: Mapping[str, ModuleModel], agent_id: str) -> tuple[str | None, str | None]:
    """The (provider, model) the environment sets for this agent's module, each None when unset."""
    choice = models.get(agent_id.split(".", 1)[0])
    if choice is None:
        return None, None
    return split_shorthand(choice.provider, choice.model)
