"""Provider names -> adapter factories, and model resolution for a turn.

The registry reads an agent through `ProviderAgent`, the few fields model resolution and the offline
providers need; `AgentDefinition` satisfies it structurally, so providers never import the definitions.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Protocol

from stepq.config import module_models
from stepq.config.module_models import split_shorthand as split_shorthand  # the one rule, read by settings too
from stepq.errors import MissingExtraError, SubmitError
from stepq.models import ToolSpec
from stepq.providers.base import AdapterAgent, ProviderAdapter
from stepq.providers.function import FunctionModel, TestModel
from stepq.providers.scripted import ScriptedAdapter, ScriptStep


class ProviderAgent(AdapterAgent, Protocol):
    """What the registry reads of an agent: its model defaults and its offline providers' script/function."""

    @property
    def default_provider(self) -> str | None: ...

    @property
    def default_model(self) -> str | None: ...

    @property
    def script(self) -> list[ScriptStep] | None: ...

    @property
    def function_model(self) -> FunctionModel | None: ...


AdapterFactory = Callable[[ProviderAgent, str], ProviderAdapter]
ConfigCheck = Callable[[], None]  # raises SubmitError naming the variable to set


def _scripted(agent: ProviderAgent, model: str) -> ProviderAdapter:
    if not agent.script:
        raise SubmitError(f"agent {agent.id} has no `script`, so it cannot run on the scripted provider")
    return ScriptedAdapter(agent.script)


def _function(agent: ProviderAgent, model: str) -> ProviderAdapter:
    if agent.function_model is None:
        raise SubmitError(
            f"agent {agent.id} has no `function_model`, so it cannot run on the function provider "
            "(set function_model=FunctionModel(fn), or use provider 'test')"
        )
    return agent.function_model


def _test(agent: ProviderAgent, model: str) -> ProviderAdapter:
    return TestModel()


# the offline providers: a fixed script, a function of the request, and the ready-made TestModel
OFFLINE = ("scripted", "function", "test")
_FACTORIES: dict[str, AdapterFactory] = {"scripted": _scripted, "function": _function, "test": _test}
_CHECKS: dict[str, ConfigCheck] = {}
# Official-SDK adapters, imported on first use: "name" -> "module:factory[:check]"
_LAZY: dict[str, str] = {
    "anthropic": "stepq.providers.anthropic.adapter:create_adapter:check_configured",
    "anthropic-vertex": "stepq.providers.anthropic.vertex:create_adapter:check_configured",
    "gemini": "stepq.providers.gemini.adapter:create_adapter:check_configured",
    "bedrock": "stepq.providers.bedrock.adapter:create_adapter:check_configured",
    "openai": "stepq.providers.openai.adapter:create_adapter:check_configured",
    "openai-compatible": "stepq.providers.openai.adapter:create_compatible_adapter:check_compatible_configured",
    "azure-openai": "stepq.providers.openai.adapter:create_azure_adapter:check_azure_configured",
}
# The pip extra that installs each adapter's SDK, and the SDK's top-level modules (how a missing extra shows).
_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "anthropic": ("anthropic", ("anthropic", "httpx2")),
    "anthropic-vertex": ("anthropic", ("anthropic", "httpx2", "google")),
    "gemini": ("gemini", ("google",)),
    "bedrock": ("bedrock", ("boto3", "botocore", "urllib3")),
    "openai": ("openai", ("openai", "httpx")),
    "openai-compatible": ("openai", ("openai", "httpx")),
    "azure-openai": ("openai", ("openai", "httpx")),
}


def register_provider(name: str, factory: AdapterFactory, check: ConfigCheck | None = None) -> None:
    _FACTORIES[name] = factory
    if check is not None:
        _CHECKS[name] = check


def _import_adapter(provider: str) -> ModuleType:
    """The adapter module of a lazy provider; a missing SDK is a MissingExtraError naming the extra."""
    try:
        return importlib.import_module(_LAZY[provider].split(":", 1)[0])
    except ImportError as exc:
        extra, sdk_modules = _EXTRAS[provider]
        if (exc.name or "").split(".")[0] in sdk_modules:
            raise MissingExtraError(f"provider {provider!r}", extra) from None
        raise


def _load_lazy(name: str) -> None:
    spec = _LAZY.get(name)
    if spec is None or name in _FACTORIES:
        return
    _, factory_name, *check = spec.split(":")
    module = _import_adapter(name)
    register_provider(name, getattr(module, factory_name), getattr(module, check[0]) if check else None)


# Each SDK adapter's tool check lives in an SDK-free module: loading agents (every CLI command, every
# worker start) must not import the SDKs, which costs seconds. The SDK is only looked for, not imported.
_TOOL_CHECKS: dict[str, str] = {
    "anthropic": "stepq.providers.anthropic.wire",
    "anthropic-vertex": "stepq.providers.anthropic.wire",
    "gemini": "stepq.providers.gemini.schema",
    "bedrock": "stepq.providers.bedrock.wire",
    "openai": "stepq.providers.openai.wire",
    "openai-compatible": "stepq.providers.openai.wire",
    "azure-openai": "stepq.providers.openai.wire",
}
# the modules whose presence shows the provider's SDK is installed (a namespace like `google` is not enough)
_SDK_PROBES: dict[str, tuple[str, ...]] = {
    "gemini": ("google.genai",),
    "anthropic-vertex": ("anthropic", "google.auth"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing (or blocked) itself
        return False


def check_tool_schemas(provider: str, specs: list[ToolSpec]) -> None:
    """Refuse, at agent load time, tool schemas this provider cannot take (its `check_tools`), and a
    provider whose SDK is not installed (MissingExtraError: `pip install 'stepq[<extra>]'`)."""
    if provider not in _LAZY:
        return
    extra, sdk_modules = _EXTRAS[provider]
    if not all(_installed(m) for m in _SDK_PROBES.get(provider, sdk_modules)):
        raise MissingExtraError(f"provider {provider!r}", extra)
    importlib.import_module(_TOOL_CHECKS[provider]).check_tools(specs)


def preload(providers: Iterable[str]) -> list[str]:
    """Import these providers' adapters (and so their SDKs) now: a worker does it at start, so its first
    steps do not pay seconds of imports inside their lease and timeouts. Returns the ones loaded; one
    whose SDK is missing is skipped (agent load already named the extra for any agent that needs it)."""
    loaded = []
    for name in dict.fromkeys(providers):
        if name in _LAZY:
            try:
                _load_lazy(name)
            except MissingExtraError:
                continue
            loaded.append(name)
    return loaded


def check_configured(provider: str) -> None:
    """Fail before any call when a provider lacks its configuration (its check names what to set)."""
    _load_lazy(provider)
    check = _CHECKS.get(provider)
    if check is not None:
        check()


def configuration_problem(provider: str) -> str | None:
    """Why this deployment cannot run `provider` (its check's words: a credential to set, an extra to install),
    or None when it can."""
    try:
        check_configured(provider)
    except (SubmitError, MissingExtraError) as exc:
        return str(exc)
    return None


def first_configured(candidates: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The first (provider, model) of `candidates`, in order, whose provider this deployment has configured."""
    return next((c for c in candidates if configuration_problem(c[0]) is None), None)


def known_providers() -> list[str]:
    return sorted({*_FACTORIES, *_LAZY})


module_models.use_provider_names(known_providers)  # settings check provider names against this registry


def create_adapter(provider: str, agent: ProviderAgent, model: str) -> ProviderAdapter:
    _load_lazy(provider)
    factory = _FACTORIES.get(provider)
    if factory is None:
        raise SubmitError(f"unknown provider {provider!r}; known: {', '.join(known_providers())}")
    return factory(agent, model)


def choose_model(
    agent: ProviderAgent,
    provider: str | None,
    model: str | None,
    env_provider: str | None,
    env_model: str | None,
    module: tuple[str | None, str | None] = (None, None),
) -> tuple[str | None, str | None]:
    """The provider and model the chain names, unchecked (None where nothing names one): what `resolve_model`
    runs, and what an agent listing shows without needing the provider configured."""
    provider, model = split_shorthand(provider, model)
    default_provider, default_model = split_shorthand(agent.default_provider, agent.default_model)
    env_p, env_m = split_shorthand(env_provider, env_model)
    module_p, module_m = module
    if module_p is not None:  # the agent's and the fleet's model ids belong to other providers
        default_model = env_m = None
    chosen_provider = provider or module_p or default_provider or env_p
    if chosen_provider is None:
        if agent.script:
            chosen_provider = "scripted"
        elif agent.function_model is not None:
            chosen_provider = "function"
        else:
            return None, None
    chosen_model = (
        model or module_m or default_model or env_m or (chosen_provider if chosen_provider in OFFLINE else None)
    )
    return chosen_provider, chosen_model


def resolve_model(
    agent: ProviderAgent,
    provider: str | None,
    model: str | None,
    env_provider: str | None,
    env_model: str | None,
    module: tuple[str | None, str | None] = (None, None),
) -> tuple[str, str]:
    """Per-turn choice (the submit checks that the agent and the policies allow one) > the module's
    STEPQ_<MODULE>_PROVIDER/_MODEL > agent default > STEPQ_PROVIDER/STEPQ_MODEL. A module provider comes with
    its module model (or is offline)."""
    chosen_provider, chosen_model = choose_model(agent, provider, model, env_provider, env_model, module)
    if chosen_provider is None:
        raise SubmitError(f"no provider for agent {agent.id}: set default_provider on the agent or STEPQ_PROVIDER")
    if chosen_provider not in _FACTORIES and chosen_provider not in _LAZY:
        raise SubmitError(f"unknown provider {chosen_provider!r}; known: {', '.join(known_providers())}")
    check_configured(chosen_provider)
    if chosen_provider == "function" and agent.function_model is None:
        _function(agent, "")  # refused at submit, with the fix named, not inside a running turn
    if chosen_model is None:
        raise SubmitError(f"no model for agent {agent.id} on {chosen_provider}: set default_model or STEPQ_MODEL")
    return chosen_provider, chosen_model


def model_layer(
    agent: ProviderAgent,
    provider: str | None,
    model: str | None,
    env_provider: str | None,
    env_model: str | None,
    module: tuple[str | None, str | None] = (None, None),
) -> str:
    """Which layer of the resolution chain chose a turn's model (see `resolve_model`)."""
    if provider or model:
        return "request"
    if module[0] or module[1]:
        return "environment"
    if agent.default_provider or agent.default_model:
        return "agent"
    return "environment" if env_provider or env_model else "default"
