"""The first stage of a step: what a delivery checks before it may call the model, and the call it plans.

`open_step` runs on every delivery that holds the lease: a redelivered step's stale content is reset,
a requested cancel ends the turn, a deploy since the last step is checked (engine/upgrade.py), and the
resolution chain (stepq.policy.resolution) sets this step's limits and agent (a `refuse` kill switch fails
the turn) and finds the tenant's usage quotas the step counts toward. `start_running` applies what is known before the model call (a spent quota, the wall clock), runs the
agent's `prepare_call` once per turn, and makes a queued turn visible as running. `plan_call` then builds the
model call: the tools, tool choice and model of this step (the agent's, its prepare_step's, the
caller's) under the policies, the tenant's own API key if it has one, and the request, with the files' bytes
filled in for this call only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stepq.agents import mcp as mcp_tools
from stepq.engine import call_hook, quota_check, step_plan, stopping, structured, tenant_keys, upgrade
from stepq.engine.compaction import view
from stepq.engine.context import Decision, StepContext, none
from stepq.engine.finish import fail, finish, finish_limit
from stepq.models import (
    EventType,
    FinishReason,
    LoopStop,
    Message,
    PolicySource,
    StepLoss,
    StepPlan,
    ToolSpec,
    TurnStatus,
)
from stepq.policy.resolution import Effective, layers_for, resolve, tenant_of
from stepq.providers.base import OUTPUT_TOOL, ProviderAdapter, StepRequest
from stepq.providers.registry import create_adapter
from stepq.store.turns import StepStart
from stepq.turns import attachments


@dataclass(slots=True)
class ModelCall:
    """This step's planned model call: what the later stages read to call, trace and dispatch."""

    plan: StepPlan
    adapter: ProviderAdapter
    specs: list[ToolSpec]  # exactly the tools the model is shown
    tool_choice: str | None
    request: StepRequest  # replaced by a compacted one when compaction runs first


def open_step(ctx: StepContext, start: StepStart) -> Decision | None:
    """Reset a redelivered step's content, honour a cancel, resolve the policies; None: the step goes on."""
    state, emitter = ctx.state, ctx.emitter
    # content of this very step reached subscribers before a crash: tell them to drop it
    if start.emitted_step == state.step and not state.status.parked:
        ctx.rt.turns.clear_emitted(state.turn_id)
        state.step_rerun = True  # its trace and span say so (engine/lifecycle.py)
        emitter.publish(EventType.STEP_RESET, {"reason": "redelivered after the worker stopped mid-step"})
    ctx.checkpoint = start.checkpoint
    if start.cancel_requested:
        return finish(ctx, TurnStatus.CANCELLED, FinishReason.CANCELLED)
    ctx.policy_version = start.policy_version
    ctx.quota_usage = start.quota_usage
    moved = upgrade.check(ctx, ctx.agent)  # the definition this step runs under (a deploy may have changed it)
    if moved is not None:
        return moved
    effective = apply_policy(ctx, start.policy_version)
    if effective.kill_switch == "refuse":
        return fail(ctx, effective.kill_message(ctx.agent.id))
    ctx.agent = effective.agent  # tools and mutation policy as the policies leave them
    quota_check.count_toward(ctx)
    return None


def start_running(ctx: StepContext) -> Decision | None:
    """The wall-clock limit (known before the call) and a queued turn shown as running; None: call the model."""
    state = ctx.state
    spent = quota_check.before_model_call(ctx)
    if spent is not None:
        return spent
    wall_clock = LoopStop.WALL_CLOCK_BUDGET
    if stopping.over_wall_clock(state) and not stopping.answers_anyway(state, ctx.agent, wall_clock):
        return finish_limit(ctx, wall_clock)
    prepared = None
    if not state.call_prepared and ctx.agent.prepare_call is not None:
        try:  # once per turn: stored with the commit below, so a redelivery after it never calls it again
            prepared = call_hook.prepare(ctx.agent, state)
        except call_hook.PrepareCallError as exc:
            return fail(ctx, str(exc))
    if state.status == TurnStatus.QUEUED or prepared:  # visible as running while the first step streams
        state.status = TurnStatus.RUNNING
        state.started_at = state.started_at or time.time()
        # shown as running with the step's first write (step-start, the first delta): the model call does not
        # wait for it. What prepare_call changed is stored before the call, so a redelivery never calls it again.
        if not prepared and ctx.ride():
            return None
        if not ctx.commit(release=False):
            return none(StepLoss.COMMIT_LOST)
    return None


def apply_policy(ctx: StepContext, version: int) -> Effective:
    """This step's limits and agent under the policies now: the turn's caller policy, its tenant's (read
    again only when the policy version read with the lease moved) and this worker's STEPQ_POLICY."""
    state, agent, rt = ctx.state, ctx.agent, ctx.rt
    tenant = tenant_of(state.metadata)
    doc = rt.policies.at_version(tenant, version) if tenant else None
    layers = layers_for(
        agent.id,
        caller=state.caller_policy,
        tenant=tenant,
        tenant_doc=doc,
        environment=rt.settings.policy,
        presets=rt.settings.budget_presets,
    )
    if state.base_limits is None:  # a turn stored before the resolution chain: its limits are its base
        state.base_limits = state.limits
    # a parked step resumes its tools first: under a collapse, the model call after them is the last
    last = state.step + 1 if state.status.parked else state.step
    effective = resolve(agent, state.base_limits, state.sources, layers, step=last)
    state.limits = effective.limits
    ctx.effective = effective
    return effective


def model_refusal(ctx: StepContext, plan: StepPlan) -> str | None:
    """Why no policy lets this step run on its model; prepare_step's model gives way to the turn's own."""
    effective, state = ctx.effective, ctx.state
    if effective is None:
        return None
    refusal = effective.model_refusal(state.provider, state.model)
    if refusal and plan.base is not None:
        plan.warnings.append(f"prepare_step's model ignored: {refusal}")
        state.provider, state.model = plan.base.provider, plan.base.model
        plan.base = None
        refusal = effective.model_refusal(state.provider, state.model)
    return f"{refusal}: the turn stops here" if refusal else None


def output_cap(ctx: StepContext, plan: StepPlan) -> None:
    """A policy's `max_output_tokens` bounds the step's cap, whatever the agent or its prepare_step asked."""
    effective = ctx.effective
    cap = effective.max_output_tokens if effective is not None else None
    if cap is None or (plan.max_output_tokens is not None and plan.max_output_tokens <= cap):
        return
    if plan.max_output_tokens is not None:
        by = effective.labels.get("max_output_tokens", "a policy") if effective is not None else "a policy"
        plan.warnings.append(f"max_output_tokens {plan.max_output_tokens} lowered to {cap} by {by}")
    plan.max_output_tokens = cap


def unsent_sampling(plan: StepPlan, adapter: ProviderAdapter) -> None:
    """A sampling field the step sets but its provider has no field for is traced, not silently dropped."""
    unsent = [
        name for name in step_plan.SAMPLING if getattr(plan, name) is not None and name not in adapter.sampling_fields
    ]
    warning = f"not sent, {adapter.name} has no such field: {', '.join(unsent)}"
    if unsent and warning not in plan.warnings:
        plan.warnings.append(warning)


def policy_trace(ctx: StepContext) -> dict[str, PolicySource]:
    """Each effective value of this step and the layer that set it, the model's included."""
    state = ctx.state
    traced = dict(ctx.effective.sources) if ctx.effective is not None else {}
    plan = state.step_plan
    layer = "agent" if plan is not None and plan.base is not None else state.sources.get("model", "default")
    traced["model"] = PolicySource(value=f"{state.provider}/{state.model}", layer=layer)
    return traced


def plan_call(ctx: StepContext) -> ModelCall | Decision:
    """This step's tools, tool choice and model (the agent's, its prepare_step's, the caller's), and its request."""
    state, agent = ctx.state, ctx.agent
    try:
        plan = step_plan.prepare(agent, state)
        output_cap(ctx, plan)
        refusal = model_refusal(ctx, plan)
        if refusal:
            return fail(ctx, refusal)
        adapter = create_adapter(state.provider, agent, state.model)
        tenant_keys.apply(ctx, adapter)  # the tenant's own API key, when it stored one for this provider
    except Exception as exc:
        return fail(ctx, str(exc))
    unsent_sampling(plan, adapter)
    # this step's tools (plan, caller's features); an MCP tool whose server changed its schema is not offered
    tools, ctx.tools_refused = mcp_tools.offered(step_plan.step_tools(agent, state, plan))
    specs = [agent.tool_spec(t) for t in tools]
    tool_choice: str | None = plan.tool_choice
    output_schema = None
    if agent.execution_mode == "object":
        output_schema = agent.output_schema()
        specs.append(structured.output_tool(agent))
        if tools and state.answer_due is None and state.step + 1 >= state.limits.max_steps:
            state.answer_due = LoopStop.MAX_STEPS  # the last allowed step is the reserved answer step
        answer_now = structured.must_answer_now(agent, state, bool(tools))
        tool_choice = OUTPUT_TOOL if answer_now else (tool_choice or "auto")
    try:  # the files' bytes, for this call only (the transcript keeps references)
        messages = state.messages if ctx.checkpoint is not None else with_files(ctx, view(state))
    except attachments.AttachmentMissingError as exc:
        return fail(ctx, str(exc))
    request = _request(ctx, plan, messages, specs, tool_choice, output_schema)
    return ModelCall(plan=plan, adapter=adapter, specs=specs, tool_choice=tool_choice, request=request)


def _request(
    ctx: StepContext,
    plan: StepPlan,
    messages: list[Message],
    specs: list[ToolSpec],
    tool_choice: str | None,
    output_schema: dict[str, object] | None,
) -> StepRequest:
    state, agent = ctx.state, ctx.agent
    # built from already-validated parts: re-validating the whole transcript each step costs O(turn length)
    return StepRequest.model_construct(
        provider=state.provider,
        model=state.model,
        system=step_plan.system_text(agent, plan, state.instructions),
        messages=messages,
        tools=specs,
        tool_choice=tool_choice,
        parallel_tool_calls=agent.parallel_tool_calls,
        output_schema=output_schema,
        max_tokens=plan.max_output_tokens,
        temperature=plan.temperature,
        top_p=plan.top_p,
        reasoning_effort=plan.reasoning_effort,
        thinking_budget=plan.thinking_budget,
        stop_sequences=agent.stop_sequences,
        step=state.step,
        attempt=state.attempt,
        options=agent.provider_options,
    )


def with_files(ctx: StepContext, messages: list[Message]) -> list[Message]:
    """The transcript with each file's bytes filled in (stored ones from the turn, URLs fetched)."""
    if not ctx.state.carries_files():  # the view only drops messages, or adds ones without files
        return messages
    state, turns = ctx.state, ctx.rt.turns
    return attachments.resolve(
        messages,
        lambda file_id: turns.load_file(state.turn_id, file_id, state.thread_id),
        ctx.rt.settings,
        state.provider,
    )
