"""The resolution chain: what one step of a turn may do, layer by layer, each layer only tightening.

Precedence, highest first: request > caller > tenant > environment > agent > default.

- request: what a submit asks for itself (`provider`, `model`, `loop=`), only while every layer allows
  runtime overrides; asking wider than the layers below allow is refused, naming the layer that binds;
- caller: the `Policy` a trusted caller passes (`Client.submit(policy=...)`, a gateway credential's policy);
- tenant: the tenant's policy in Redis (`stepq policy set --tenant T ...`), read again for every step, so a
  change reaches running turns at their next step;
- environment: `STEPQ_POLICY` of the process (the submitter at submit, the worker at each step);
- agent / default: the definition, and the library's defaults where it sets nothing.

A policy never widens: a limit looser than a lower layer's does nothing, a mutation policy only
downgrades, allowlists (tools, models) only remove. The effective value of each axis is the tightest one,
credited to the highest layer that holds it; the step's trace records each (`StepTrace.policy`).

A policy document maps scopes to policies: `*` (every agent), a module (`support`), an agent id
(`support.refunds`); every scope that matches an agent applies.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.agents.step_control import tightest
from stepq.errors import PolicyError
from stepq.models import (
    DEFAULT_BUDGET_PRESETS,
    Budget,
    LoopLimits,
    Policy,
    PolicySource,
    Quota,
    UnknownPresetError,
    budget_preset,
)
from stepq.models import SCOPE_ALL as SCOPE_ALL  # a policy document's syntax, kept with its model
from stepq.models import check_scope as check_scope

LAYERS = ("request", "caller", "tenant", "environment", "agent", "default")
NUMBERS = ("max_steps", "max_tool_calls", "max_tokens", "max_wall_clock_s")
# loosest to tightest: a policy may move an agent right, never left
MUTATION_ORDER = ("confirm-required", "destructive-confirm-required", "read-only")
KILL_ORDER = ("off", "collapse", "refuse")
TENANT_KEY = "tenant"  # the metadata key naming a turn's tenant (the gateway and threads set it)


@dataclass(frozen=True)
class Layer:
    """One policy of one layer, with the words an error uses for it."""

    name: str  # caller | tenant | environment
    label: str  # e.g. "tenant acme's policy (support.*)"
    policy: Policy


def tenant_of(metadata: Mapping[str, Any]) -> str | None:
    """The turn's tenant: its metadata's `tenant` string, if any."""
    value = metadata.get(TENANT_KEY)
    return value if isinstance(value, str) and value else None


def matching(doc: Mapping[str, Policy], agent_id: str) -> list[tuple[str, Policy]]:
    """The scopes of a document that apply to an agent, widest first."""
    module = agent_id.split(".", 1)[0]
    return [(scope, doc[scope]) for scope in (SCOPE_ALL, module, agent_id) if scope in doc]


def layers_for(
    agent_id: str,
    *,
    caller: Policy | None = None,
    tenant: str | None = None,
    tenant_doc: Mapping[str, Policy] | None = None,
    environment: Mapping[str, Policy] | None = None,
    presets: Mapping[str, Budget] = DEFAULT_BUDGET_PRESETS,
) -> list[Layer]:
    """Every policy that applies to one turn of `agent_id`, highest layer first; a policy's budget preset is
    read from `presets` (STEPQ_BUDGET_PRESETS) into the caps it leaves unset."""
    layers: list[Layer] = []
    if caller is not None:
        layers.append(Layer("caller", "the caller's policy", caller))
    for scope, policy in matching(tenant_doc or {}, agent_id):
        layers.append(Layer("tenant", f"tenant {tenant}'s policy ({scope})", policy))
    for scope, policy in matching(environment or {}, agent_id):
        layers.append(Layer("environment", f"STEPQ_POLICY ({scope})", policy))
    return [_with_preset(x, presets) for x in layers]


def _with_preset(layer: Layer, presets: Mapping[str, Budget]) -> Layer:
    """A layer whose policy names a budget preset, with the preset's caps where the policy sets none itself.
    A name this process does not know fails closed (PolicyError naming the layer), never runs unbounded."""
    name = layer.policy.budget
    if name is None:
        return layer
    try:
        preset = budget_preset(name, presets)
    except UnknownPresetError as exc:
        raise PolicyError(f"{layer.label}: {exc}") from None
    caps = {k: v for k, v in preset.model_dump().items() if k in NUMBERS and v is not None}
    unset = {k: v for k, v in caps.items() if getattr(layer.policy, k) is None}
    return Layer(layer.name, layer.label, layer.policy.model_copy(update=unset))


def quota_rules(tenant: str, tenant_doc: Mapping[str, Policy], agent_id: str) -> list[tuple[str, Quota, str]]:
    """The tenant's quotas that count a turn of `agent_id`: `(scope, quota, label)` for each matching scope that
    sets one (`*` counts all the tenant's turns, a module or agent scope only theirs)."""
    return [
        (scope, policy.quota, f"tenant {tenant}'s quota ({scope})")
        for scope, policy in matching(tenant_doc, agent_id)
        if policy.quota is not None
    ]


def base_sources(agent: AgentDefinition, overrides: Any = None) -> dict[str, str]:
    """The layer of each base limit: the request's override, the agent's own value, or the default."""
    sources: dict[str, str] = {}
    asked: dict[str, Any] = {}
    if overrides is not None:
        asked = {"max_steps": overrides.max_steps, **overrides.budget.model_dump()}
    budget = agent.loop.budget.model_fields_set
    for axis in NUMBERS:
        if asked.get(axis) is not None:
            sources[axis] = "request"
        elif axis == "max_steps":
            sources[axis] = "agent" if "max_steps" in agent.loop.model_fields_set else "default"
        elif axis in budget:
            sources[axis] = "agent"
    return sources


@dataclass
class Effective:
    """What one step (or a submit) runs with once every layer has spoken."""

    agent: AgentDefinition  # the agent as the step sees it: tools and mutation policy tightened
    limits: LoopLimits
    sources: dict[str, PolicySource] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # axis -> who set it, in words (for errors)
    kill_switch: str = "off"
    kill_label: str = ""
    runtime_override: bool = True
    runtime_override_label: str = ""
    layers: list[Layer] = field(default_factory=list)
    max_output_tokens: int | None = None  # the tightest layer's cap on one model call's output (None: no cap)

    def model_refusal(self, provider: str, model: str) -> str | None:
        """Why no layer's model allowlist takes `provider/model`, or None when every one does."""
        for layer in self.layers:
            patterns = layer.policy.models
            if patterns is not None and not any(model_matches(p, provider, model) for p in patterns):
                shown = ", ".join(patterns) or "none"
                return f"model {provider}/{model} is not allowed by {layer.label} (allowed: {shown})"
        return None

    def kill_message(self, agent_id: str) -> str:
        return f"agent {agent_id} is switched off by {self.kill_label} (kill switch: refuse)"


def model_matches(pattern: str, provider: str, model: str) -> bool:
    """`provider/model` (glob allowed: `anthropic/claude-*`), a bare provider, or `*`."""
    return pattern == provider or fnmatch.fnmatchcase(f"{provider}/{model}", pattern)


def allowed_patterns(layers: Iterable[Layer]) -> list[str] | None:
    """The `provider/model` patterns every layer's model allowlist admits, for a picker to offer (None: no layer
    lists models). A pattern of one layer is kept when each other listing layer admits it (read as the models it
    names: `bedrock` is `bedrock/*`), so two layers' lists show as the tighter of the two."""
    lists = [x.policy.models for x in layers if x.policy.models is not None]
    if not lists:
        return None
    kept: dict[str, None] = {}
    for i, patterns in enumerate(lists):
        for pattern in patterns:
            provider, _, model = pattern.partition("/")
            named = model or "*"
            if all(any(model_matches(q, provider, named) for q in other) for other in lists[:i] + lists[i + 1 :]):
                kept[pattern] = None
    return list(kept)


def resolve(
    agent: AgentDefinition,
    base: LoopLimits,
    sources: Mapping[str, str],
    layers: Iterable[Layer],
    step: int = 0,
) -> Effective:
    """Walk the layers over the agent and its request-tightened `base` limits; see the module docstring."""
    layers = list(layers)
    eff = Effective(agent=agent, limits=base.model_copy(), layers=layers)
    _numbers(eff, agent, base, sources, layers)
    _runtime_override(eff, agent, layers)
    _output_cap(eff, layers)
    update: dict[str, Any] = {}
    _mutation(eff, agent, layers, update)
    _tools(eff, agent, layers, update)
    _stops(eff, layers)
    _tool_choice(eff, agent, layers)
    _prompt_sections(eff, agent, layers, update)
    _kill_switch(eff, layers, step, update)
    if update:
        eff.agent = agent.model_copy(update=update)
    return eff


def _numbers(
    eff: Effective, agent: AgentDefinition, base: LoopLimits, sources: Mapping[str, str], layers: list[Layer]
) -> None:
    for axis in NUMBERS:
        own = getattr(base, axis)
        layer = sources.get(axis, "agent")
        words = {"request": "the request", "default": "the default"}.get(layer, f"agent {agent.id}")
        candidates = [(layer, own, words)] if own is not None else []
        candidates += [
            (x.name, getattr(x.policy, axis), x.label) for x in layers if getattr(x.policy, axis) is not None
        ]
        if not candidates:
            continue
        value = min(c[1] for c in candidates)
        name, _, label = min((c for c in candidates if c[1] == value), key=lambda c: LAYERS.index(c[0]))
        setattr(eff.limits, axis, value)
        eff.sources[axis] = PolicySource(value=value, layer=name)
        eff.labels[axis] = label


def _output_cap(eff: Effective, layers: list[Layer]) -> None:
    """The lowest `max_output_tokens` of the layers: a ceiling for the agent's and prepare_step's per-step caps
    (applied to each step's plan, engine/begin.py); the highest layer holding it is credited."""
    caps = [(x.policy.max_output_tokens, x) for x in layers if x.policy.max_output_tokens is not None]
    if not caps:
        return
    value = min(c[0] for c in caps if c[0] is not None)
    holder = next(x for cap, x in caps if cap == value)
    eff.max_output_tokens = value
    eff.sources["max_output_tokens"] = PolicySource(value=value, layer=holder.name)
    eff.labels["max_output_tokens"] = holder.label


def _runtime_override(eff: Effective, agent: AgentDefinition, layers: list[Layer]) -> None:
    layer = "agent" if "allow_runtime_override" in agent.model_fields_set else "default"
    eff.runtime_override = agent.allow_runtime_override
    eff.runtime_override_label = f"agent {agent.id} (allow_runtime_override=False)"
    if eff.runtime_override:
        for x in layers:  # highest first: the highest layer that turns it off is the one named
            if x.policy.allow_runtime_override is False:
                eff.runtime_override, layer = False, x.name
                eff.runtime_override_label = f"{x.label} (allow_runtime_override=false)"
                break
    eff.sources["allow_runtime_override"] = PolicySource(value=eff.runtime_override, layer=layer)


def _mutation(eff: Effective, agent: AgentDefinition, layers: list[Layer], update: dict[str, Any]) -> None:
    own = "read-only" if agent.read_only else agent.mutation_policy
    value, layer = own, "agent" if {"read_only", "mutation_policy"} & agent.model_fields_set else "default"
    for x in reversed(layers):  # lowest first: a higher layer takes the credit for an equal value
        asked = x.policy.mutation_policy
        if asked is not None and MUTATION_ORDER.index(asked) >= MUTATION_ORDER.index(value):
            value, layer = asked, x.name
    if value != own:
        update["mutation_policy"] = value
    eff.sources["mutation_policy"] = PolicySource(value=value, layer=layer)


def _tools(eff: Effective, agent: AgentDefinition, layers: list[Layer], update: dict[str, Any]) -> None:
    names = [*agent.allowed_tools, *(t.exposed_name for t in agent.mcp_tools)]
    kept, layer = list(names), "agent"
    for x in reversed(layers):
        allowed = x.policy.allowed_tools
        if allowed is None:
            continue
        narrower = [n for n in kept if n in allowed]
        if narrower != kept:  # lowest first: the last layer to remove a tool is the highest that did
            layer, kept = x.name, narrower
    if kept != names:
        update["allowed_tools"] = [n for n in agent.allowed_tools if n in kept]
        update["mcp_tools"] = [t for t in agent.mcp_tools if t.exposed_name in kept]
        if agent.active_tools is not None:
            update["active_tools"] = [n for n in agent.active_tools if n in kept]
    eff.sources["allowed_tools"] = PolicySource(value=kept, layer=layer)


def _stops(eff: Effective, layers: list[Layer]) -> None:
    """A layer's stop conditions join the turn's: each can only end the turn sooner, so none is dropped."""
    limits = eff.limits
    for x in reversed(layers):  # lowest first: a higher layer takes the credit for the tightest step count
        stops = x.policy.stop_when or []
        counts = [s.step_count for s in stops if s.step_count is not None]
        if counts and (limits.stop_after_steps is None or min(counts) < limits.stop_after_steps):
            limits.stop_after_steps = min(counts)
        limits.stop_on_tool = sorted({*limits.stop_on_tool, *(s.has_tool_call for s in stops if s.has_tool_call)})
        limits.stop_custom = list(dict.fromkeys([*limits.stop_custom, *(s.custom for s in stops if s.custom)]))
        if stops:
            eff.sources["stop_when"] = PolicySource(
                value=[s.model_dump(exclude_none=True) for s in stops], layer=x.name
            )


def _tool_choice(eff: Effective, agent: AgentDefinition, layers: list[Layer]) -> None:
    """Every step's tool choice, tightened layer by layer (it rides the turn's limits, which prepare_step cannot
    loosen); where neither contains the other, the higher layer's choice binds."""
    limits = eff.limits
    current = limits.tool_choice or agent.tool_choice
    layer = "request" if limits.tool_choice is not None else "agent"
    for x in reversed(layers):  # lowest first
        asked = x.policy.tool_choice
        if asked is None:
            continue
        tight = tightest(current, asked)
        if tight != current:
            current, layer = tight if tight is not None else asked, x.name
    if layer not in ("request", "agent"):
        limits.tool_choice = current
        eff.sources["tool_choice"] = PolicySource(value=current, layer=layer)


def _prompt_sections(eff: Effective, agent: AgentDefinition, layers: list[Layer], update: dict[str, Any]) -> None:
    """A layer's text for a section the agent declares replaces the agent's (a higher layer's wins); a name the
    agent does not declare is left out, and the trace records it, so a policy cannot add prompt text of its own."""
    sections, layer, ignored = dict(agent.prompt_sections), "", []
    for x in reversed(layers):  # lowest first: the highest layer that set a section is the one credited
        for name, text in (x.policy.prompt_sections or {}).items():
            if name in sections:
                sections[name], layer = text, x.name
            else:
                ignored.append(name)
    if layer:
        update["prompt_sections"] = sections
        changed = sorted(n for n in sections if sections[n] != agent.prompt_sections[n])
        eff.sources["prompt_sections"] = PolicySource(value=changed, layer=layer)
    if ignored:
        eff.sources["prompt_sections_ignored"] = PolicySource(value=sorted(set(ignored)), layer="agent")


def policy_model(agent: AgentDefinition, layers: Iterable[Layer], own: list[str]) -> tuple[str, str, str] | None:
    """The `(layer, provider, model)` the highest layer's `default_model` sets, or None when no layer sets one.
    It must be within the agent's allowed models: every layer's allowlist, or (none listing models) `own`, the
    agent's default model and fallbacks; PolicyError naming the layer otherwise."""
    layers = list(layers)
    for x in layers:  # highest first
        chosen = x.policy.default_model
        if chosen is None:
            continue
        provider, _, model = chosen.partition("/")
        allowed = allowed_patterns(layers)
        admitted = allowed if allowed is not None else own
        if not any(model_matches(p, provider, model) for p in admitted):
            shown = ", ".join(admitted) or "none"
            raise PolicyError(
                f"{x.label} sets default_model {chosen}, which agent {agent.id} does not allow (allowed: {shown})"
            )
        return x.name, provider, model
    return None


def _kill_switch(eff: Effective, layers: list[Layer], step: int, update: dict[str, Any]) -> None:
    strongest: Layer | None = None
    for x in layers:  # highest first; a stronger switch lower down still wins
        if KILL_ORDER.index(x.policy.kill_switch or "off") > KILL_ORDER.index(_mode(strongest)):
            strongest = x
    if strongest is None:
        return
    eff.kill_switch = strongest.policy.kill_switch or "off"
    eff.kill_label = strongest.label
    eff.sources["kill_switch"] = PolicySource(value=eff.kill_switch, layer=strongest.name)
    if eff.kill_switch == "collapse":  # this step is the turn's last model call, and it shows no tools
        if eff.limits.max_steps > step + 1:
            eff.limits.max_steps = step + 1
            eff.sources["max_steps"] = PolicySource(value=step + 1, layer=strongest.name)
            eff.labels["max_steps"] = f"{strongest.label} (kill switch: collapse)"
        update.update(
            allowed_tools=[], mcp_tools=[], task_plan=False, active_tools=None, tool_choice=None, prepare_step=None
        )
        eff.sources["allowed_tools"] = PolicySource(value=[], layer=strongest.name)


def _mode(layer: Layer | None) -> str:
    return (layer.policy.kill_switch if layer is not None else None) or "off"
