"""Resolve what one step runs with: its tools, tool choice, model, output cap, sampling and extra system text.

The agent's static `active_tools` / `tool_choice` are the defaults; its `prepare_step` may replace them for
one step (never showing a tool the allowlist or the mutation gate hides: such a name is ignored and the
step's trace records a warning); the caller's `loop` overrides then narrow every step (prepare_step cannot
loosen them). The plan is made once per step and kept on the turn, so a retried or resumed step, and its
tool dispatch, use the same one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from stepq.agents import runtime_context
from stepq.agents.definition import AgentDefinition
from stepq.agents.step_control import StepContext, StepOverrides, check_choice, tightest
from stepq.agents.tools import ToolDefinition
from stepq.errors import StepqError
from stepq.models import AssistantMessage, Fallback, StepPlan, ToolCall, TurnState
from stepq.providers.registry import known_providers, split_shorthand

log = logging.getLogger("stepq.engine")
SAMPLING = ("temperature", "top_p", "reasoning_effort", "thinking_budget")  # set per step, mapped per provider


class PrepareStepError(StepqError):
    """The agent's prepare_step raised or returned something that is not step overrides: the turn fails."""


def prepare(agent: AgentDefinition, state: TurnState) -> StepPlan:
    """This step's plan (made now, or the one this step already made); sets the step's provider/model."""
    current = state.step_plan
    if current is not None and current.step == state.step:
        return current
    if current is not None and current.base is not None:  # the last step ran on prepare_step's model
        state.provider, state.model = current.base.provider, current.base.model
    shown = [t.name for t in agent.visible_tools(state.features)]
    tools = [n for n in shown if agent.active_tools is None or n in agent.active_tools]
    choice = agent.tool_choice
    max_tokens = agent.max_output_tokens
    warnings: list[str] = []
    asked = _ask(agent, state)
    base: Fallback | None = None
    if asked is not None:
        if asked.active_tools is not None:
            hidden = [n for n in asked.active_tools if n not in shown]
            if hidden:
                warnings.append(f"prepare_step's active_tools named tools the agent does not show: {', '.join(hidden)}")
            tools = [n for n in shown if n in asked.active_tools]
        choice = asked.tool_choice if asked.tool_choice is not None else choice
        max_tokens = asked.max_output_tokens if asked.max_output_tokens is not None else max_tokens
        if asked.model is not None:
            base = _switch_model(agent, state, asked.model)
    tools, choice = _narrow(state, tools, choice, warnings)
    plan = StepPlan(
        step=state.step,
        tools=tools,
        tool_choice=choice if tools else None,
        max_output_tokens=max_tokens,
        system=asked.system if asked is not None and asked.system else None,
        base=base,
        warnings=warnings,
        **_sampling(agent, asked),
    )
    for warning in warnings:
        log.warning("agent %s step %s: %s", agent.id, state.step, warning)
    state.step_plan = plan
    return plan


def _sampling(agent: AgentDefinition, asked: StepOverrides | None) -> dict[str, Any]:
    """The step's sampling: prepare_step's value where it set one, else the agent's."""
    picked: dict[str, Any] = {}
    for name in SAMPLING:
        value = getattr(asked, name) if asked is not None else None
        picked[name] = value if value is not None else getattr(agent, name)
    return picked


def _narrow(
    state: TurnState, tools: list[str], choice: str | None, warnings: list[str]
) -> tuple[list[str], str | None]:
    """The caller's overrides hold on every step; a forced tool the step does not show becomes `required`."""
    limits = state.limits
    if limits.active_tools is not None:
        removed = [n for n in tools if n not in limits.active_tools]
        if removed:
            warnings.append(f"not shown, the turn's active_tools exclude them: {', '.join(removed)}")
        tools = [n for n in tools if n in limits.active_tools]
    if limits.tool_choice is not None:
        tight = tightest(choice, limits.tool_choice)
        if tight is None:
            warnings.append(f"tool_choice {choice!r} ignored: the turn's overrides set {limits.tool_choice!r}")
            tight = limits.tool_choice
        choice = tight
    if choice is not None and check_choice(choice, tools) is not None:
        fallback = "required" if tools else None
        warnings.append(f"tool_choice {choice!r} names no tool shown on this step; sent as {fallback or 'no tools'}")
        choice = fallback
    return tools, choice


def _switch_model(agent: AgentDefinition, state: TurnState, asked: str) -> Fallback | None:
    """Run this step on prepare_step's model; the turn's own is kept in the plan for the next step."""
    provider, model = split_shorthand(None, asked)
    provider = provider or state.provider
    if provider not in known_providers():
        raise PrepareStepError(f"prepare_step of agent {agent.id} chose unknown provider {provider!r}")
    if (provider, model) == (state.provider, state.model) or model is None:
        return None
    base = Fallback(provider=state.provider, model=state.model)
    state.provider, state.model = provider, model
    return base


def _ask(agent: AgentDefinition, state: TurnState) -> StepOverrides | None:
    fn = agent.prepare_step
    if fn is None:
        return None
    context = StepContext(
        step=state.step,
        usage=state.usage,
        last_tool_calls=_last_calls(state),
        turn_id=state.turn_id,
        agent=agent.id,
        provider=state.provider,
        model=state.model,
        cost=state.cost,
        tool_calls_made=state.tool_calls_made,
        metadata=dict(state.metadata),
        context=runtime_context.typed(agent.context_schema, state.context),
    )
    try:
        answer = fn(context)
    except Exception as exc:
        log.exception("prepare_step of agent %s raised", agent.id)
        raise PrepareStepError(f"prepare_step of agent {agent.id} raised {type(exc).__name__}: {exc}") from exc
    if answer is None:
        return None
    if isinstance(answer, StepOverrides):
        return _with_context(agent, state, answer)
    if not isinstance(answer, Mapping):
        raise PrepareStepError(
            f"prepare_step of agent {agent.id} returned {type(answer).__name__}; return StepOverrides, a dict or None"
        )
    try:
        return _with_context(agent, state, StepOverrides.model_validate(dict(answer)))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PrepareStepError(
            f"prepare_step of agent {agent.id} returned bad overrides: {first['msg']} at {where}"
        ) from None


def _with_context(agent: AgentDefinition, state: TurnState, asked: StepOverrides) -> StepOverrides:
    """prepare_step's new runtime context, validated, becomes the turn's (stored with this step's commit)."""
    if asked.context is not None:
        try:
            state.context = runtime_context.check_context(
                agent.id, agent.context_schema, asked.context, "prepare_step's context"
            )
        except runtime_context.ContextError as exc:
            raise PrepareStepError(f"prepare_step of agent {agent.id}: {exc}") from None
    return asked


def _last_calls(state: TurnState) -> list[ToolCall]:
    """The previous step's tool calls (none before the turn's first step)."""
    if state.step == 0:
        return []
    for message in reversed(state.messages):
        if isinstance(message, AssistantMessage):
            return list(message.tool_calls)
    return []


def step_tools(agent: AgentDefinition, state: TurnState, plan: StepPlan) -> list[ToolDefinition]:
    """The definitions of the tools the step shows, in the allowlist's order."""
    return [t for t in agent.visible_tools(state.features) if t.name in plan.tools]


def callable_tools(agent: AgentDefinition, state: TurnState) -> list[ToolDefinition]:
    """What the model may call on this step: its shown tools, none under `tool_choice="none"` (a provider that
    cannot say `none` while the transcript holds tool calls still declares them: a call is refused here)."""
    plan = state.step_plan
    if plan is None or plan.step != state.step:  # a turn from before plans: the whole visible set
        return agent.visible_tools(state.features)
    if plan.tool_choice == "none":
        return []
    return step_tools(agent, state, plan)


def callable_by_name(agent: AgentDefinition, state: TurnState) -> dict[str, ToolDefinition]:
    return {t.name: t for t in callable_tools(agent, state)}


def system_text(agent: AgentDefinition, plan: StepPlan, turn: str | None = None) -> str | None:
    """The agent's instructions, the turn's (prepare_call's `instructions`), then this step's extra text."""
    parts = [p for p in (agent.instructions, turn, plan.system) if p]
    return "\n\n".join(parts) or None
