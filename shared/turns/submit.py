"""Validate a submit request and store the new turn. Every refusal happens before anything is written."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from stepq.agents.definition import AgentDefinition, Budget, StopWhen
from stepq.agents.runtime_context import check_context
from stepq.agents.step_control import at_most, check_choice
from stepq.agents.stops import get_stop_condition, unknown_message
from stepq.config import module_models
from stepq.errors import (
    MissingFeaturesError,
    OverrideError,
    PolicyError,
    QuotaExceededError,
    SubmitError,
    UnknownAgentError,
)
from stepq.fleet.runtime import Runtime
from stepq.jsonsafe import caller_json_problem
from stepq.models import (
    DEFAULT_BUDGET_PRESETS,
    EventType,
    LoopLimits,
    Message,
    Policy,
    SystemMessage,
    TurnState,
    UnknownPresetError,
    UserMessage,
    budget_preset,
    new_turn_id,
)
from stepq.policy.resolution import (
    Effective,
    Layer,
    base_sources,
    layers_for,
    policy_model,
    quota_rules,
    resolve,
    tenant_of,
)
from stepq.providers.registry import choose_model, model_layer, resolve_model
from stepq.store import quotas
from stepq.store.broker_push import BrokerPush
from stepq.store.keys import idempotency_home
from stepq.turns import attachments as files
from stepq.turns import trace_context
from stepq.turns.fall_through import fall_through
from stepq.turns.transcripts import check_pairing

_MESSAGES = TypeAdapter(list[Message])


class LoopOverrides(BaseModel):
    """What a caller may change about the loop: each value may only tighten the agent's own."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int | None = Field(default=None, ge=1)
    stop_when: list[StopWhen] = Field(default_factory=list)
    budget: Budget | str = Field(default_factory=Budget)  # or a preset's name: `small`, `standard`, `long`, ...
    active_tools: list[str] | None = None  # a subset of the tools the agent shows
    tool_choice: str | None = None  # as tight as the agent's or tighter: auto < required < a tool; auto < none


def parse_overrides(
    overrides: LoopOverrides | dict[str, Any] | None, presets: Mapping[str, Budget] = DEFAULT_BUDGET_PRESETS
) -> LoopOverrides | None:
    """A caller's `loop=` as LoopOverrides, a budget preset's name replaced by its budget; OverrideError naming
    what is wrong."""
    if isinstance(overrides, LoopOverrides) and isinstance(overrides.budget, str):
        try:
            return overrides.model_copy(update={"budget": budget_preset(overrides.budget, presets)})
        except UnknownPresetError as exc:
            raise OverrideError(f"loop.budget: {exc}") from None
    if overrides is None or isinstance(overrides, LoopOverrides):
        return overrides
    if not isinstance(overrides, dict):
        hint = " (a JSON string? parse it with json.loads first)" if isinstance(overrides, str | bytes) else ""
        raise OverrideError(
            f"loop must be a mapping such as {{'max_steps': 3}} or a LoopOverrides, not {type(overrides).__name__}"
            + hint
        )
    try:
        parsed = LoopOverrides.model_validate(overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        # the path to the field; a union's member (`budget` is a preset name or a Budget) is not part of it
        where = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and p[:1].isupper())) or "loop"
        raise OverrideError(f"invalid loop overrides: {first['msg']} at {where}") from None
    return parse_overrides(parsed, presets)


def tighten(
    agent: AgentDefinition,
    overrides: LoopOverrides | dict[str, Any] | None,
    features: list[str] | None = None,
    ceiling: Effective | None = None,
) -> LoopLimits:
    """The agent's loop limits with the caller's overrides applied; a widening attempt is refused. With a
    `ceiling` (the policies' effective limits), an override is also refused above it, naming the layer."""
    limits = agent.loop.limits()
    overrides = parse_overrides(overrides)
    if overrides is None:
        return limits

    def narrower(name: str, asked: float | None, allowed: float | None) -> float | None:
        if asked is None:
            return allowed
        axis = name.rsplit(".", 1)[-1]
        cap = getattr(ceiling.limits, axis) if ceiling is not None else allowed
        who = ceiling.labels.get(axis, f"agent {agent.id}") if ceiling is not None else f"agent {agent.id}"
        if cap is not None and asked > cap:
            raise OverrideError(f"{name}={asked} exceeds the limit of {cap} set by {who}; overrides may only tighten")
        return asked

    for stop in overrides.stop_when:
        if stop.custom is not None and get_stop_condition(stop.custom) is None:
            raise OverrideError(f"loop.stop_when: {unknown_message(stop.custom)}")
    budget = overrides.budget
    assert isinstance(budget, Budget)  # parse_overrides replaced a preset's name
    max_steps = narrower("max_steps", overrides.max_steps, limits.max_steps)
    max_tool_calls = narrower("budget.max_tool_calls", budget.max_tool_calls, limits.max_tool_calls)
    max_tokens = narrower("budget.max_tokens", budget.max_tokens, limits.max_tokens)
    extra_counts = [s.step_count for s in overrides.stop_when if s.step_count is not None]
    stop_after = min([c for c in [limits.stop_after_steps, *extra_counts] if c is not None], default=None)
    active_tools, tool_choice = _narrow_tools(agent, overrides, features)
    return LoopLimits(
        active_tools=active_tools,
        tool_choice=tool_choice,
        max_steps=int(max_steps or limits.max_steps),
        stop_after_steps=stop_after,
        stop_on_tool=sorted({*limits.stop_on_tool, *(s.has_tool_call for s in overrides.stop_when if s.has_tool_call)}),
        # an extra condition can only end the loop sooner: the agent's first, then the caller's, in order
        stop_custom=list(dict.fromkeys([*limits.stop_custom, *(s.custom for s in overrides.stop_when if s.custom)])),
        max_tool_calls=int(max_tool_calls) if max_tool_calls is not None else None,
        max_wall_clock_s=narrower("budget.max_wall_clock_s", budget.max_wall_clock_s, limits.max_wall_clock_s),
        max_tokens=int(max_tokens) if max_tokens is not None else None,
        # a larger reserve is the tighter one: the answer step gets at least what the agent holds back
        answer_reserve_tokens=max(
            [r for r in (limits.answer_reserve_tokens, budget.answer_reserve_tokens) if r is not None], default=None
        ),
    )


def _narrow_tools(
    agent: AgentDefinition, overrides: LoopOverrides, features: list[str] | None
) -> tuple[list[str] | None, str | None]:
    """The caller's active_tools and tool_choice, refused unless they narrow what the agent shows this caller
    and chooses."""
    shown = [t.name for t in agent.visible_tools(features or [])]
    default = [n for n in shown if agent.active_tools is None or n in agent.active_tools]
    asked = overrides.active_tools
    if asked is not None:
        wider = [n for n in asked if n not in default]
        if wider:
            raise OverrideError(
                f"active_tools names {', '.join(map(repr, wider))}, which agent {agent.id} does not show "
                f"(it shows: {', '.join(default) or 'none'}); overrides may only tighten"
            )
    choice = overrides.tool_choice
    if choice is not None:
        problem = check_choice(choice, asked if asked is not None else default)
        if problem:
            raise OverrideError(f"invalid loop overrides: {problem}")
        if not at_most(choice, agent.tool_choice):
            raise OverrideError(
                f"tool_choice={choice!r} is looser than agent {agent.id}'s {agent.tool_choice!r}; overrides may only "
                "tighten (auto < required < a tool name; auto < none)"
            )
    return asked, choice


def _check_utf8(text: str, what: str) -> None:
    """Text that cannot be encoded as UTF-8 (lone surrogates, e.g. bytes decoded with surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SubmitError(
            f"{what} is not valid UTF-8 text ({exc.reason} at character {exc.start}); decode the input as UTF-8 "
            "first (bytes.decode('utf-8', errors='replace') keeps what can be read)"
        ) from None


def build_messages(
    rt: Runtime,
    agent: AgentDefinition,
    prompt: str | None,
    messages: list[Any] | None,
    attachments: list[Any] | None = None,
    provider: str = "",
    pending: files.Pending | None = None,
) -> list[Message]:
    """The turn's messages, validated. Files (`attachments` and file parts) are checked and their bytes
    moved into `pending` (to store with the turn), leaving references in the messages."""
    if (prompt is None) == (messages is None):
        raise SubmitError("give exactly one of prompt=… or messages=…")
    limit = rt.settings.max_prompt_chars
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise SubmitError("prompt must be a non-empty string")
        if len(prompt) > limit:
            raise SubmitError(f"prompt is {len(prompt)} characters; the limit is {limit} (STEPQ_MAX_PROMPT_CHARS)")
        _check_utf8(prompt, "prompt")
        built: list[Message] = [UserMessage(content=prompt)]
        files.attach(built, attachments, rt.settings)
        _take_files(rt, agent, built, provider, pending)
        return built
    try:
        parsed = _MESSAGES.validate_python(messages)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SubmitError(f"malformed messages: {first['msg']} at {'.'.join(map(str, first['loc']))}") from None
    if not parsed:
        raise SubmitError("messages must not be empty")
    unknown = _unknown_field(messages, parsed, "messages")
    if unknown:
        raise SubmitError(f"malformed messages: unknown field {unknown} (it would be dropped)")
    files.attach(parsed, attachments, rt.settings)
    _take_files(rt, agent, parsed, provider, pending)
    if len(parsed) > rt.settings.max_messages:
        raise SubmitError(f"{len(parsed)} messages; the limit is {rt.settings.max_messages}")
    size = 0
    for i, (m, given) in enumerate(zip(parsed, messages or [], strict=False)):
        try:
            size += len(m.model_dump_json())
        except PydanticSerializationError:
            _check_utf8(json.dumps(given, ensure_ascii=False, default=str), f"messages[{i}]")
            raise SubmitError(f"messages[{i}] cannot be stored as JSON") from None
    if size > limit:
        raise SubmitError(f"messages total {size} characters; the limit is {limit} (STEPQ_MAX_PROMPT_CHARS)")
    if any(isinstance(m, SystemMessage) for m in parsed):
        raise SubmitError("system messages come from the agent definition, not the caller")
    check_pairing(parsed)
    return parsed


def _take_files(
    rt: Runtime, agent: AgentDefinition, messages: list[Message], provider: str, pending: files.Pending | None
) -> None:
    taken = files.prepare(
        messages, rt.settings, agent.id, agent.accepted_media_types, provider, dict(agent.provider_options)
    )
    if pending is not None:
        pending.stored.update(taken.stored)
        pending.objects.update(taken.objects)


def _unknown_field(raw: Any, parsed: Any, loc: str) -> str | None:
    """The first caller-given field the models do not know (e.g. `content` on an assistant message)."""
    if isinstance(parsed, BaseModel) and isinstance(raw, dict):
        fields = type(parsed).model_fields
        for name in raw:
            if name not in fields:
                return f"{loc}.{name}"
        for name in fields:
            if name in raw:
                found = _unknown_field(raw[name], getattr(parsed, name), f"{loc}.{name}")
                if found:
                    return found
    elif isinstance(parsed, list) and isinstance(raw, list):
        for index, (r, p) in enumerate(zip(raw, parsed, strict=False)):
            found = _unknown_field(r, p, f"{loc}.{index}")
            if found:
                return found
    return None


def _caller_policy(policy: Policy | dict[str, Any] | None) -> Policy | None:
    if policy is None:
        return None
    if isinstance(policy, Policy):
        return _without_quota(policy)
    if not isinstance(policy, dict):
        raise SubmitError(
            f"policy must be a Policy or a mapping such as {{'max_steps': 3}}, not {type(policy).__name__}"
        )
    try:
        parsed = Policy.model_validate(policy)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SubmitError(f"invalid policy: {first['msg']} at {'.'.join(map(str, first['loc']))}") from None
    return _without_quota(parsed)


def _without_quota(policy: Policy) -> Policy:
    """A caller's policy cannot hold a quota (it counts a tenant's usage): refused, never silently ignored."""
    if policy.quota is not None:
        raise SubmitError("policy.quota counts a tenant's usage: set it in the tenant's policy, not the caller's")
    return policy


def _check_quota(rt: Runtime, agent_id: str, metadata: dict[str, Any], layers: list[Layer]) -> None:
    """A tenant whose quota is spent is refused before anything is stored (HTTP 429 with Retry-After)."""
    tenant = tenant_of(metadata)
    if tenant is None or not any(x.name == "tenant" and x.policy.quota for x in layers):
        return
    rules = quota_rules(tenant, rt.policies.get(tenant), agent_id)
    windows = [quotas.window(rt.keys, tenant, scope, quota, label, time.time()) for scope, quota, label in rules]
    spent = quotas.denial(windows, rt.quotas.read([w.key for w in windows]))
    if spent is not None:
        raise QuotaExceededError(spent.message, resets_at=spent.window.resets_at, retry_after_s=spent.retry_after_s)


def own_models(agent: AgentDefinition, rt: Runtime, module: tuple[str | None, str | None]) -> list[str]:
    """The models an agent runs unasked (its default and its fallbacks): what a policy may choose among when no
    layer lists models (as `GET /v1/agents` shows them)."""
    provider, model = choose_model(agent, None, None, rt.settings.provider, rt.settings.model, module)
    fallbacks = [f"{f.provider}/{f.model}" for f in agent.fallbacks or rt.settings.fallbacks]
    return [f"{provider}/{model}", *fallbacks] if provider and model else fallbacks


def policy_layers(rt: Runtime, agent_id: str, caller: Policy | None, metadata: dict[str, Any]) -> list[Layer]:
    """The caller's, the tenant's (read now) and the environment's policies for a turn of `agent_id`."""
    tenant = tenant_of(metadata)
    tenant_doc = rt.policies.get(tenant) if tenant else None
    return layers_for(
        agent_id,
        caller=caller,
        tenant=tenant,
        tenant_doc=tenant_doc,
        environment=rt.settings.policy,
        presets=rt.settings.budget_presets,
    )


def new_turn_state(
    rt: Runtime,
    agent_id: str,
    *,
    prompt: str | None = None,
    messages: list[Any] | None = None,
    idempotency_key: str | None = None,
    metadata: dict[str, Any] | None = None,
    features: list[str] | None = None,
    provider: str | None = None,
    model: str | None = None,
    loop: LoopOverrides | dict[str, Any] | None = None,
    priority: str | None = None,
    attachments: list[Any] | None = None,
    provider_batch: bool = False,
    policy: Policy | dict[str, Any] | None = None,
    home: str | None = None,
    traceparent: str | None = None,
    context: Any = None,
    defer_tools: bool = False,
) -> tuple[AgentDefinition, TurnState]:
    """Validate a submit and build the turn it asks for, storing nothing (a thread stores its turns itself).
    `home` places the turn's keys (a thread's turns live beside their thread, see stepq.store.keys)."""
    agent = rt.agents.get(agent_id) if isinstance(agent_id, str) else None
    if agent is None and isinstance(agent_id, str) and agent_id in rt.agents.disabled():
        raise UnknownAgentError(f"agent {agent_id!r} is disabled by {rt.agents.disabled()[agent_id]} (agent_overrides)")
    if agent is None:
        known = ", ".join(rt.agents.ids()) or "none loaded (set STEPQ_AGENT_MODULES)"
        raise UnknownAgentError(f"unknown agent {agent_id!r}; known agents: {known}")
    if features is not None and (
        not isinstance(features, list | tuple | set | frozenset) or not all(isinstance(f, str) for f in features)
    ):
        raise SubmitError("features must be a list of feature names (strings)")
    missing = sorted(set(agent.required_features) - set(features or []))
    if missing:
        raise MissingFeaturesError(f"agent {agent.id} requires features the caller lacks: {', '.join(missing)}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 200):
        raise SubmitError("idempotency_key must be a string of 1 to 200 characters")
    if priority not in (None, "interactive", "batch"):
        raise SubmitError(f"priority must be 'interactive' or 'batch', not {priority!r}")
    if provider_batch and (priority or agent.priority) != "batch":
        raise SubmitError("provider_batch=True needs priority='batch': provider batch APIs answer in minutes to hours")
    if metadata is not None and not isinstance(metadata, dict):
        raise SubmitError("metadata must be a JSON object")
    if not isinstance(defer_tools, bool):
        raise SubmitError("defer_tools must be true or false")
    problem = caller_json_problem(metadata, "metadata")
    if problem:
        raise SubmitError(problem)
    stored_context = None if context is None else check_context(agent.id, agent.context_schema, context)
    caller = _caller_policy(policy)
    layers = policy_layers(rt, agent.id, caller, metadata or {})
    ceiling = resolve(agent, agent.loop.limits(), base_sources(agent), layers)
    if ceiling.kill_switch == "refuse":
        raise PolicyError(ceiling.kill_message(agent.id))
    _check_quota(rt, agent.id, metadata or {}, layers)
    overrides = parse_overrides(loop, rt.settings.budget_presets)
    asked = [name for name, value in (("provider", provider), ("model", model)) if value]
    asked += ["loop"] if overrides is not None and overrides.model_fields_set else []
    if asked and not ceiling.runtime_override:
        raise PolicyError(
            f"agent {agent.id} does not allow per-call overrides ({', '.join(asked)}): turned off by "
            f"{ceiling.runtime_override_label}"
        )
    module = module_models.for_agent(rt.settings.module_models, agent.id)
    set_by = None if provider or model else policy_model(agent, layers, own_models(agent, rt, module))
    layer = model_layer(agent, provider, model, rt.settings.provider, rt.settings.model, module)
    try:
        chosen_provider, chosen_model = resolve_model(
            agent,
            set_by[1] if set_by else provider,
            set_by[2] if set_by else model,
            rt.settings.provider,
            rt.settings.model,
            module=module,
        )
    except SubmitError:
        fallen = fall_through(agent, rt.settings.fallbacks) if layer == "agent" and set_by is None else None
        if fallen is None:
            raise  # fails closed, with the provider's own words on what to configure
        (chosen_provider, chosen_model), layer = fallen, "fall-through"
    refusal = ceiling.model_refusal(chosen_provider, chosen_model)
    if refusal:
        raise PolicyError(f"{refusal}; choose an allowed model")
    base = tighten(ceiling.agent, overrides, features, ceiling=ceiling)
    sources = base_sources(agent, overrides)
    sources["model"] = set_by[0] if set_by is not None else layer
    pending = files.Pending()
    state = TurnState(
        turn_id=new_turn_id(idempotency_home(agent.id, idempotency_key) if idempotency_key else home),
        agent=agent.id,
        provider=chosen_provider,
        model=chosen_model,
        messages=build_messages(rt, agent, prompt, messages, attachments, chosen_provider, pending),
        limits=resolve(agent, base, sources, layers).limits,
        base_limits=base,
        sources=sources,
        caller_policy=caller,
        metadata=metadata or {},
        features=sorted(set(features or [])),
        priority=priority or agent.priority,
        provider_batch=bool(provider_batch),
        defer_tools=defer_tools,
        idempotency_key=idempotency_key,
        created_at=time.time(),
        traceparent=trace_context.valid(traceparent),  # every step's spans join this trace
        context=stored_context,
    )
    try:
        TurnState.model_validate_json(state.model_dump_json())
    except ValidationError as exc:
        raise SubmitError(f"metadata is not JSON-serializable: {exc.errors()[0]['msg']}") from None
    except PydanticSerializationError as exc:
        raise SubmitError(f"metadata is not JSON-serializable: {exc}") from None
    state._files, state._objects = pending.stored, pending.objects
    return agent, state


def create_turn(
    rt: Runtime,
    agent_id: str,
    *,
    prompt: str | None = None,
    messages: list[Any] | None = None,
    idempotency_key: str | None = None,
    metadata: dict[str, Any] | None = None,
    features: list[str] | None = None,
    provider: str | None = None,
    model: str | None = None,
    loop: LoopOverrides | dict[str, Any] | None = None,
    priority: str | None = None,
    attachments: list[Any] | None = None,
    provider_batch: bool = False,
    policy: Policy | dict[str, Any] | None = None,
    sent: bool = True,
    traceparent: str | None = None,
    context: Any = None,
    defer_tools: bool = False,
    first_step: Callable[[TurnState], BrokerPush | None] | None = None,
) -> tuple[TurnState, bool]:
    """Validate and store a turn. Returns (state, created); created is False for a repeated key.
    `sent=False`: the caller records its send of step 0 (`mark_sent`); until then the sweeper sends it.
    `first_step`: the validated turn's step-0 message for a broker that is this Redis (or None): the store
    pushes it with the turn, only if it stores it; the caller sends nothing then."""
    agent, state = new_turn_state(
        rt,
        agent_id,
        prompt=prompt,
        messages=messages,
        idempotency_key=idempotency_key,
        metadata=metadata,
        features=features,
        provider=provider,
        model=model,
        loop=loop,
        priority=priority,
        attachments=attachments,
        provider_batch=provider_batch,
        policy=policy,
        traceparent=traceparent,
        context=context,
        defer_tools=defer_tools,
    )
    batch_id = state.metadata.get("batch_id")
    push = first_step(state) if first_step is not None else None
    files.upload(state._objects)
    rt.turns.store_files(state)
    start = {"agent": agent.id, "provider": state.provider, "model": state.model, "mode": agent.execution_mode}
    existing = rt.turns.create(
        state,
        idempotency_key,
        batch_id if isinstance(batch_id, str) else None,
        sent=sent,
        announce=rt.events.announcement(state.turn_id, EventType.TURN_START, 0, start),
        push=push,
    )
    rt.turns.files_stored(state, kept=not existing)
    if existing:
        found = rt.turns.load(existing)
        if found is None:
            raise SubmitError(f"idempotency key {idempotency_key!r} names turn {existing}, which has expired")
        return found, False
    return state, True
