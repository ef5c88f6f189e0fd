"""One delivery of `run_step(turn_id, step)`: fence, lease, run the step, commit, decide what's next.

The Celery task is a thin shell around `StepRunner.deliver`: it maps the returned
`Decision` onto Celery (enqueue the next step, retry with a countdown, reschedule
itself while another worker holds the lease, or nothing). Everything durable
happens here, against Redis, so it runs the same in-process with no broker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis

from stepq.agents import mcp as mcp_tools
from stepq.agents import task_plan
from stepq.agents.definition import AgentDefinition
from stepq.approvals import ApprovalClaim
from stepq.batches.items import result_line
from stepq.engine import batch_step, client_tools, edits, step_plan, stopping, structured, tracing
from stepq.engine.compaction import Compactor, view
from stepq.engine.dispatch import PreparedCall, StepDispatcher
from stepq.engine.emitter import StepEmitter
from stepq.engine.output import parse_object, repair_note
from stepq.engine.pricing import add_costs, step_cost
from stepq.engine.retry import next_fallback, retry_countdown
from stepq.engine.tool_exec import ToolExecution
from stepq.errors import InvalidOutputError, StoreUnavailableError
from stepq.fleet.metrics import (
    RATE_LIMIT_WAITS,
    TURNS,
    FirstChunkProbe,
    record_retry,
    record_step,
    record_usage,
    retry_reason,
    track_pending,
    untrack_pending,
)
from stepq.fleet.ratelimit import RateLimit, estimate_tokens
from stepq.fleet.runtime import Runtime
from stepq.logging import Redactor, describe_exception, secret_values
from stepq.logging import bind as bind_log_context
from stepq.models import (
    Delta,
    EventType,
    FailedAttempt,
    Fallback,
    FinishReason,
    LoopStop,
    Message,
    ParkedStep,
    PendingApproval,
    PlanStep,
    PolicySource,
    ReasoningPart,
    StepLoss,
    StepOutput,
    StepPlan,
    StepTrace,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolResultStatus,
    ToolSpec,
    TurnState,
    TurnStatus,
    Usage,
    UserMessage,
    new_approval_id,
)
from stepq.policy.resolution import Effective, layers_for, resolve, tenant_of
from stepq.providers.base import OUTPUT_TOOL, ProviderAdapter, ProviderError, StepRequest
from stepq.providers.registry import create_adapter
from stepq.store.approvals import ApprovalRecord
from stepq.store.batch_runs import BatchClaim, TurnEnd
from stepq.store.keys import home
from stepq.store.leases import StepLease
from stepq.store.tool_results import ToolResultStore
from stepq.store.turns import LeaseHeld, PreparedWrite, StepStart
from stepq.turns import attachments, threads

log = logging.getLogger("stepq.engine")
# Redis unreachable: a step that meets one is left to the sweeper (DESIGN.md §4.6), never failed for it
STORE_OUTAGES = (StoreUnavailableError, redis.ConnectionError, redis.TimeoutError)


def worker_id() -> str:
    """Host and pid of the process running a step (computed per call: prefork children differ)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Decision:
    """What the task shell must do after a delivery."""

    action: Literal["none", "next", "retry", "reschedule"]
    step: int = 0
    countdown: float = 0.0
    attempt: int = 0
    reason: str = ""
    priority: str = "interactive"  # picks the queue the next message goes to
    start: tuple[str, ...] = ()  # other turns whose first step to send now (a thread's next turn)
    batch: str = ""  # the driven batch of a batch turn that just ended: its driver makes a pass now
    claim: BatchClaim | None = None  # ...or the batch's next item, claimed for this worker to run


def _none(reason: str) -> Decision:
    return Decision("none", reason=reason)


def _maybe(turn_id: str | None) -> tuple[str, ...]:
    return (turn_id,) if turn_id else ()


class StepRunner:
    """Runs one delivery; make one per delivery (it keeps that delivery's lease and checkpoint)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lease: StepLease | None = None
        self._checkpoint: StepOutput | None = None
        self._pending_checkpoint: PreparedWrite | None = None
        self._emitter: StepEmitter | None = None
        self._tools_refused: list[dict[str, str]] = []  # MCP tools not offered this step, and why
        self._effective: Effective | None = None  # this step's policies resolved (see _apply_policy)

    # ------------------------------------------------------------------ delivery

    def deliver(self, turn_id: str, step: int) -> Decision:
        """One delivery of run_step: the lease and everything the step needs come in one round trip;
        the step is fenced by its number, and its final commit checks and releases the lease."""
        rt = self.rt
        token = rt.leases.new_token()
        start = rt.turns.begin_step(turn_id, step, token, rt.leases.ttl_ms)
        if isinstance(start, LeaseHeld):  # look again just after the lease would lapse (its holder may be dead)
            countdown = min(rt.settings.effective_reschedule_countdown_s, start.remaining_s + 0.05)
            return Decision("reschedule", step=step, countdown=countdown, reason="leased")
        lease = rt.leases.adopt(turn_id, token)
        self._lease = lease
        try:
            state = start.state
            if state is None:
                return _none("unknown turn")
            if state.status.terminal or state.step != step:
                # a finish that committed but died before its thread hook: the hook runs again (idempotent)
                start_next = threads.turn_finished(rt, state) if state.status.terminal else None
                return replace(_none("stale delivery"), priority=state.priority, start=_maybe(start_next))
            now = time.time()
            if state.not_before and state.not_before > now + 0.05 and not start.cancel_requested:
                return Decision(
                    "reschedule", step=step, countdown=state.not_before - now, reason="not yet", priority=state.priority
                )
            return replace(self._run(state, lease, start), priority=state.priority)
        finally:
            rt.leases.release(lease)

    def _commit(self, state: TurnState, release: bool = True) -> bool:
        """A fenced commit: only while this delivery's lease is held; the step's last commit releases it."""
        lease = self._lease
        prepared = self.rt.turns.prepare_commit(state, lease_token=lease.token if lease else None, release=release)
        checkpoint, self._pending_checkpoint = self._pending_checkpoint, None
        if checkpoint is not None and self._emitter is not None:  # not written yet, and moot once this commits
            self._emitter.discard_write(checkpoint.script, checkpoint.keys)
        if self._emitter is not None:  # the step's events go out just before its commit, in the same round trip
            [reply] = self._emitter.flush_with((prepared.script, prepared.keys, prepared.args))
        else:
            reply = prepared.script(keys=prepared.keys, args=prepared.args)
        ok = self.rt.turns.finish_commit(prepared, reply)
        if ok and release and lease is not None:
            lease.released = True
        return ok

    def _run(self, state: TurnState, lease: StepLease, start: StepStart) -> Decision:
        emitter = StepEmitter(self.rt.events, state.turn_id, state.step, self.rt.settings.coalesce_window_ms / 1000)
        self._emitter = emitter
        turn_id, step = state.turn_id, state.step
        try:
            with mcp_tools.step_scope():  # the step's MCP sessions (if it uses any) close with it
                return self._run_step(state, lease, start, emitter)
        except STORE_OUTAGES:
            raise  # nothing can be stored now: the sweeper runs the step again once Redis is back
        except Exception as exc:  # a bug (ours, a tool's, an adapter's) must not leave the turn leased and running
            return self._crashed(turn_id, step, emitter, exc)
        finally:
            emitter.flush()  # anything still deferred (e.g. on a path that did not commit) goes out now

    def _crashed(self, turn_id: str, step: int, emitter: StepEmitter, exc: Exception) -> Decision:
        """A step that raised: its turn fails with the error on one line (the traceback goes to the log). It
        fails from its last commit, so nothing the step left half-done is stored with the failure."""
        log.error("step %s of turn %s crashed", step, turn_id, exc_info=exc)
        state = self.rt.turns.load(turn_id)
        if state is None or state.status.terminal or state.step != step:
            return _none("crashed after its commit")  # what it committed stands; the sweeper sends what is unsent
        return self._fail(state, emitter, f"step {step} crashed: {self._describe(exc)}")

    def _describe(self, exc: BaseException) -> str:
        """An unexpected exception as events and the turn's error show it: one line, bounded, secrets masked."""
        settings = self.rt.settings
        return describe_exception(exc, Redactor(secret_values(settings)), settings.tool_error_chars)

    def _run_step(self, state: TurnState, lease: StepLease, start: StepStart, emitter: StepEmitter) -> Decision:
        rt = self.rt
        bind_log_context(attempt=state.attempt)
        agent = rt.agents.get(state.agent)
        if agent is None:
            return self._fail(state, emitter, f"agent {state.agent!r} is not loaded on this worker")
        # content of this very step reached subscribers before a crash: tell them to drop it
        if start.emitted_step == state.step and not state.status.parked:
            rt.turns.clear_emitted(state.turn_id)
            emitter.publish(EventType.STEP_RESET, {"reason": "redelivered after the worker stopped mid-step"})
        self._checkpoint = start.checkpoint
        if start.cancel_requested:
            return self._finish(state, emitter, TurnStatus.CANCELLED, FinishReason.CANCELLED)
        effective = self._apply_policy(state, agent, start.policy_version)
        if effective.kill_switch == "refuse":
            return self._fail(state, emitter, effective.kill_message(agent.id))
        agent = effective.agent  # tools and mutation policy as the policies leave them
        if state.status.parked:
            return self._resume(state, agent, emitter)
        if self._over_wall_clock(state) and not self._answers_anyway(state, agent, LoopStop.WALL_CLOCK_BUDGET):
            return self._finish_limit(state, agent, emitter, LoopStop.WALL_CLOCK_BUDGET)
        if state.status == TurnStatus.QUEUED:  # visible as running while the first step streams
            state.status = TurnStatus.RUNNING
            state.started_at = state.started_at or time.time()
            if not self._commit(state, release=False):
                return _none(StepLoss.COMMIT_LOST)
        started, traced = time.monotonic(), len(state.trace.steps)
        decision = self._model_step(state, agent, emitter, lease)
        record_step(
            state,
            decision.action,
            decision.reason,
            time.monotonic() - started,
            tracing.new_traces(state, traced),
            self._tenant(state),
        )
        return decision

    # ------------------------------------------------------------------ the resolution chain (stepq.policy.resolution)

    def _apply_policy(self, state: TurnState, agent: AgentDefinition, version: int) -> Effective:
        """This step's limits and agent under the policies now: the turn's caller policy, its tenant's (read
        again only when the policy version read with the lease moved) and this worker's STEPQ_POLICY."""
        tenant = tenant_of(state.metadata)
        doc = self.rt.policies.at_version(tenant, version) if tenant else None
        layers = layers_for(
            agent.id, caller=state.caller_policy, tenant=tenant, tenant_doc=doc, environment=self.rt.settings.policy
        )
        if state.base_limits is None:  # a turn stored before the resolution chain: its limits are its base
            state.base_limits = state.limits
        # a parked step resumes its tools first: under a collapse, the model call after them is the last
        last = state.step + 1 if state.status.parked else state.step
        effective = resolve(agent, state.base_limits, state.sources, layers, step=last)
        state.limits = effective.limits
        self._effective = effective
        return effective

    def _model_refusal(self, state: TurnState, plan: StepPlan) -> str | None:
        """Why no policy lets this step run on its model; prepare_step's model gives way to the turn's own."""
        effective = self._effective
        if effective is None:
            return None
        refusal = effective.model_refusal(state.provider, state.model)
        if refusal and plan.base is not None:
            plan.warnings.append(f"prepare_step's model ignored: {refusal}")
            state.provider, state.model = plan.base.provider, plan.base.model
            plan.base = None
            refusal = effective.model_refusal(state.provider, state.model)
        return f"{refusal}: the turn stops here" if refusal else None

    def _policy_trace(self, state: TurnState) -> dict[str, PolicySource]:
        """Each effective value of this step and the layer that set it, the model's included."""
        traced = dict(self._effective.sources) if self._effective is not None else {}
        plan = state.step_plan
        layer = "agent" if plan is not None and plan.base is not None else state.sources.get("model", "default")
        traced["model"] = PolicySource(value=f"{state.provider}/{state.model}", layer=layer)
        return traced

    # ------------------------------------------------------------------ the model call

    def _model_step(self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter, lease: StepLease) -> Decision:
        started = time.monotonic()
        try:  # this step's tools, tool choice and model (the agent's, its prepare_step's, the caller's)
            plan = step_plan.prepare(agent, state)
            refusal = self._model_refusal(state, plan)
            if refusal:
                return self._fail(state, emitter, refusal)
            adapter = create_adapter(state.provider, agent, state.model)
        except Exception as exc:
            return self._fail(state, emitter, str(exc))
        # this step's tools (plan, caller's features); an MCP tool whose server changed its schema is not offered
        tools, self._tools_refused = mcp_tools.offered(step_plan.step_tools(agent, state, plan))
        specs = [ToolSpec(name=t.name, description=t.description, input_schema=t.input_schema) for t in tools]
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
            messages = state.messages if self._checkpoint is not None else self._with_files(state, view(state))
        except attachments.AttachmentMissingError as exc:
            return self._fail(state, emitter, str(exc))
        # built from already-validated parts: re-validating the whole transcript each step costs O(turn length)
        request = StepRequest.model_construct(
            provider=state.provider,
            model=state.model,
            system=step_plan.system_text(agent, plan),
            messages=messages,
            tools=specs,
            tool_choice=tool_choice,
            output_schema=output_schema,
            max_tokens=plan.max_output_tokens,
            temperature=agent.temperature,
            stop_sequences=agent.stop_sequences,
            step=state.step,
            attempt=state.attempt,
            options=agent.provider_options,
        )
        if self._checkpoint is None:  # over the context window's share: compact what the model sees first
            compacted = self._compact(state, agent, adapter, request, emitter, lease)
            if isinstance(compacted, Decision):
                return compacted
            request = compacted
        checkpoint = self._checkpoint
        if checkpoint is not None:  # the model already answered this step before a crash: replay, don't re-ask
            output = self._replay(state, emitter, specs, checkpoint)
        else:
            called = self._batched(state, agent, adapter, request, emitter, specs)
            if called is None:
                called = self._call_model(state, agent, adapter, request, emitter, lease, specs)
            if isinstance(called, Decision):
                return called
            output = called

        cost = step_cost(self.rt.settings.prices, state.provider, state.model, output.usage, batch=output.batched)
        failed, state.failed_attempts = state.failed_attempts, []
        repairing = bool(state.trace.steps) and state.trace.steps[-1].invalid_output
        trace = StepTrace(
            step=state.step,
            provider=state.provider,
            model=state.model,
            tool_calls=[c.name for c in output.message.tool_calls],
            usage=output.usage,
            cost=add_costs(cost, *(f.cost for f in failed)),
            failed_attempts=failed,
            retries=state.attempt,
            duration_s=round(time.monotonic() - started, 4),
            stop_reason=output.finish_reason.value,
            raw_stop_reason=output.raw_finish_reason,
            tools=[t.name for t in specs],
            tool_choice=tool_choice,
            max_output_tokens=plan.max_output_tokens,
            warnings=plan.warnings,
            repair=repairing,
            batch=output.batched,
            policy=self._policy_trace(state),
        )
        state.usage = state.usage + output.usage
        state.cost = add_costs(state.cost, cost)  # failed attempts were added when they failed
        state.trace.steps.append(trace)
        state.attempt = 0
        state.not_before = None
        emitter.defer(EventType.STEP_FINISH, {"usage": output.usage.model_dump(), "finish_reason": trace.stop_reason})

        if not state.malformed_retry_used and adapter.is_malformed(output):
            state.malformed_retry_used = True
            trace.malformed = True
            state.messages.append(UserMessage(content=adapter.malformed_note()))
            return self._advance(state, agent, emitter)

        answer = structured.as_answer(agent, output) if agent.execution_mode == "object" else None
        if answer is not None:
            return self._final_answer(state, agent, emitter, answer)
        calls = output.message.tool_calls
        if not calls:
            return self._final_answer(state, agent, emitter, output)

        state.messages.append(output.message)
        limits = state.limits
        if limits.max_tool_calls is not None and state.tool_calls_made + len(calls) > limits.max_tool_calls:
            if self._reserve_answer(state, agent, LoopStop.TOOL_CALL_BUDGET):  # the calls are not run
                note = "not run: the turn's tool-call budget is spent; give your final answer now"
                state.messages.append(ToolResultMessage(results=[_refusal(c, note) for c in calls]))
                tracing.record_calls(state, calls)
                return self._advance(state, agent, emitter)
            return self._finish_limit(state, agent, emitter, LoopStop.TOOL_CALL_BUDGET)
        dispatcher = self._dispatcher(state, agent, emitter, adapter.tool_failure_breaker)
        prepared = [dispatcher.prepare(c) for c in calls]
        for p in prepared:
            emitter.defer(EventType.TOOL_CALL, {"id": p.call.id, "name": p.call.name, "args": p.call.args})
        self._update_plan(state, emitter, task_plan.mark_running(state.plan, calls))
        if self._checkpoint is None:
            # A re-run of this step replays this answer (same calls, same ids), so results stored by
            # tool-call id keep side effects to one execution. Before a tool with side effects runs, the
            # answer is durable; read-only tools (safe to run again) do not wait for it: it rides the
            # step's next write (or the flush window, for a slow tool), and the commit supersedes it.
            save = self.rt.turns.checkpoint_write(state.turn_id, state.step, "")
            turns, step = self.rt.turns, state.step
            emitter.defer_write(save.script, save.keys, lambda: turns.checkpoint_args(step, output.model_dump_json()))
            self._pending_checkpoint = save  # serialized only if it is written before the commit
            stored: dict[str, ToolResult] = {}  # results exist only once a checkpoint does
        else:
            emitter.flush()  # subscribers learn of the calls before any tool runs
            stored = dispatcher.stored(calls)
        results: dict[str, ToolResult] = {}
        for p in prepared:
            if p.waits:  # for a person's approval, or for a client-side tool's result
                continue
            results[p.call.id] = stored.get(p.call.id) or dispatcher.execute(p)
            self._publish_result(emitter, results[p.call.id])
        waiting = [p for p in prepared if p.waits and p.call.id not in stored]
        for p in prepared:
            if p.waits and p.call.id in stored:
                results[p.call.id] = stored[p.call.id]
        self._update_plan(state, emitter, task_plan.after_results(state.plan, calls, results))
        if waiting:
            return self._park(state, agent, emitter, output, trace, waiting)
        state.messages.append(ToolResultMessage(results=[results[c.id] for c in calls]))
        state.tool_calls_made += len(calls)
        return self._after_tools(state, agent, emitter, calls)

    def _call_model(
        self,
        state: TurnState,
        agent: AgentDefinition,
        adapter: ProviderAdapter,
        request: StepRequest,
        emitter: StepEmitter,
        lease: StepLease,
        specs: list[ToolSpec],
    ) -> StepOutput | Decision:
        """The model call: rate limit, stream, classify failures; checkpoint an answer that asks for tools."""
        rt = self.rt
        scope, limit = self._rate_limit(state, agent)
        grant = None
        if limit.active:
            chars = sum(len(m.model_dump_json()) for m in state.messages) + len(agent.instructions or "")
            grant = rt.limiter.acquire(scope, limit, estimate_tokens(chars, agent.max_output_tokens))
            if not grant.allowed:
                RATE_LIMIT_WAITS.labels(state.provider, state.model, grant.reason).inc()
                return Decision(
                    "reschedule", step=state.step, countdown=grant.wait_s, reason=f"rate limit ({grant.reason})"
                )
        self._defer_step_start(
            state, emitter, specs, granted_at=grant.at if grant is not None else None, refused=self._tools_refused
        )
        used: int | None = None
        guard = _EventWriteGuard(emitter.emit)
        probe = FirstChunkProbe(guard)  # times the first content delta (stepq_time_to_first_chunk_seconds)
        try:
            output = adapter.stream_step(request, probe, lambda: lease.should_stop)
            used = output.usage.total_tokens
        except ProviderError as exc:
            guard.raise_if_failed()  # our event write failed inside the stream: not the provider's error
            self._count_failed_attempt(state, exc)
            emitter.flush()
            if exc.status == 429:
                rt.limiter.penalize(scope, limit, exc.retry_after_s)
            return self._provider_failure(state, agent, emitter, exc)
        except Exception as exc:  # an adapter bug must not leave the turn hanging
            guard.raise_if_failed()
            if isinstance(exc, redis.RedisError):
                raise
            emitter.flush()
            err = ProviderError(self._describe(exc), retryable=False)
            return self._provider_failure(state, agent, emitter, err)
        finally:
            probe.observe(state.provider, state.model)
            if grant is not None:
                rt.limiter.release(scope, grant, used)
        if lease.lost.is_set():  # the heartbeat lost it; the commit is fenced on the lease anyway
            return _none(StepLoss.LEASE_LOST)
        if lease.cancelled.is_set():
            state.text = emitter_text(emitter)
            return self._finish(state, emitter, TurnStatus.CANCELLED, FinishReason.CANCELLED)

        return output

    # ------------------------------------------------------------------ provider batch APIs (see batch_step)

    def _batched(
        self,
        state: TurnState,
        agent: AgentDefinition,
        adapter: ProviderAdapter,
        request: StepRequest,
        emitter: StepEmitter,
        specs: list[ToolSpec],
    ) -> StepOutput | Decision | None:
        """A provider-batch turn's model call: park it for a batch, or take the batch's answer (or its
        failure, under the usual retry budget). None: run it online (no batch API, deadline, spent)."""
        if not batch_step.applies(state, adapter):
            return None
        routed = batch_step.route(self.rt, state, agent, request)
        if isinstance(routed, batch_step.Waiting):
            return _none("waiting for its provider batch")
        if isinstance(routed, batch_step.Park):
            return self._park_for_batch(state, emitter, routed.custom_id)
        state.status = TurnStatus.RUNNING
        state.batch_deadline_at = None
        if isinstance(routed, batch_step.Online):
            state.batch_online_step = state.step
            emitter.publish(EventType.STEP_RETRY, {"attempt": state.attempt, "countdown": 0.0, "error": routed.reason,
                                                   "status": None, "code": "provider-batch", "retry_after": None,
                                                   "reason": routed.reason})  # fmt: skip
            return None
        self._defer_step_start(state, emitter, specs)
        if isinstance(routed, ProviderError):
            emitter.flush()
            return self._provider_failure(state, agent, emitter, routed)
        batch_step.replay(routed, emitter)
        return routed

    def _park_for_batch(self, state: TurnState, emitter: StepEmitter, custom_id: str) -> Decision:
        """The request waits in the collector; the turn holds no worker until the tick brings its answer."""
        state.status = TurnStatus.AWAITING_BATCH
        state.batch_deadline_at = round(time.time() + self.rt.settings.provider_batch_deadline_s, 3)
        if not self._commit(state):
            return _none(StepLoss.COMMIT_LOST)
        emitter.publish(
            EventType.STEP_BATCHED,
            {"provider": state.provider, "model": state.model, "attempt": state.attempt,
             "custom_id": custom_id, "deadline_at": state.batch_deadline_at},
        )  # fmt: skip
        return _none("parked for a provider batch")

    def _replay(self, state: TurnState, emitter: StepEmitter, specs: list[ToolSpec], output: StepOutput) -> StepOutput:
        """Re-publish a checkpointed answer after the step-reset, so subscribers see the step whole."""
        self._defer_step_start(state, emitter, specs, replayed=True, refused=self._tools_refused)
        for part in output.message.parts:
            if isinstance(part, TextPart) and part.text:
                emitter.emit(Delta("text", part.text))
            elif isinstance(part, ReasoningPart) and part.text:
                emitter.emit(Delta("reasoning", part.text))
        emitter.flush()
        return output

    @staticmethod
    def _defer_step_start(
        state: TurnState,
        emitter: StepEmitter,
        specs: list[ToolSpec],
        replayed: bool = False,
        granted_at: float | None = None,
        refused: list[dict[str, str]] | None = None,
    ) -> None:
        data: dict[str, Any] = {
            "attempt": state.attempt,
            "worker": worker_id(),
            "provider": state.provider,
            "model": state.model,
            "tools": [t.name for t in specs],  # exactly what the model is shown
        }
        if replayed:
            data["replayed"] = True
        if refused:  # MCP tools whose server no longer advertises the pinned schema: name and reason
            data["tools_refused"] = refused
        if granted_at is not None:  # the rate limiter's grant (Redis clock): the time this call counts from
            data["rate_limit_granted_at"] = granted_at
        emitter.defer(EventType.STEP_START, data)  # goes out with the first delta, or within the flush window

    def _rate_limit(self, state: TurnState, agent: AgentDefinition) -> tuple[str, RateLimit]:
        """The limit for this step's provider/model: the agent's own, else `provider/model`, else `provider`."""
        scope = f"{state.provider}/{state.model}"
        if agent.rate_limit is not None:
            return scope, agent.rate_limit
        configured = self.rt.settings.rate_limits
        for key in (scope, state.provider):
            if key in configured:
                return key, configured[key]
        return scope, RateLimit()

    def _dispatcher(
        self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter, provider_breaker: int | None
    ) -> StepDispatcher:
        breaker = agent.tool_failure_breaker or provider_breaker
        sink = _EmitterResultSink(self.rt.tool_results, emitter, state.turn_id)
        s = self.rt.settings
        execution = ToolExecution(s, self._lease.cancelled if self._lease is not None else None)
        return StepDispatcher(agent, state, self.rt.tool_results, sink, breaker, s.max_tool_result_chars, execution)

    @staticmethod
    def _publish_result(emitter: StepEmitter, result: ToolResult) -> None:
        emitter.defer(
            EventType.TOOL_RESULT,
            {
                "id": result.tool_call_id,
                "name": result.name,
                "output": result.output,
                "is_error": result.is_error,
                "status": result.status.value,
            },
        )

    @staticmethod
    def _update_plan(state: TurnState, emitter: StepEmitter, plan: list[PlanStep] | None) -> None:
        """Store a changed task plan with the turn and stream it whole (`plan-update`)."""
        if plan is not None:
            state.plan = plan
            emitter.defer(EventType.PLAN_UPDATE, task_plan.event_data(plan))

    # ------------------------------------------------------------------ after a step

    def _final_answer(
        self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter, output: StepOutput
    ) -> Decision:
        text = output.message.text
        if agent.execution_mode == "object":
            try:
                state.object = parse_object(agent, text)
            except InvalidOutputError as exc:
                traced = tracing.this_step(state)
                if traced is not None:
                    traced.invalid_output = True
                if state.repairs_used < agent.output_repairs and self._steps_left(state):
                    state.repairs_used += 1
                    state.messages.append(output.message)
                    state.messages.append(UserMessage(content=repair_note(agent, str(exc))))
                    # the invalid answer's object deltas are void: the repair step streams a new one
                    emitter.publish(
                        EventType.STEP_RESET, {"reason": "repairing an answer that did not match the schema"}
                    )
                    return self._advance(state, agent, emitter)
                state.messages.append(output.message)
                return self._fail(state, emitter, f"the answer does not match the output schema: {exc}")
        state.messages.append(output.message)
        state.text = text
        state.stopped_by = state.answer_due  # the limit that cut the tool steps short, if one did
        return self._finish(state, emitter, TurnStatus.COMPLETED, output.finish_reason)

    def _after_tools(
        self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter, calls: list[ToolCall]
    ) -> Decision:
        tracing.record_calls(state, calls)  # the step's trace is written with its commit, sizes included
        if agent.execution_mode == "object" and state.answer_due is not None:  # the answer step called tools
            return self._finish_limit(state, agent, emitter, state.answer_due)
        try:
            stop = self._loop_stop(state, agent, calls)
        except stopping.StopConditionError as exc:
            return self._fail(state, emitter, str(exc))
        if stop is None:
            return self._advance(state, agent, emitter)
        if self._reserve_answer(state, agent, stop):
            return self._advance(state, agent, emitter)  # the reserved answer step
        return self._finish_limit(state, agent, emitter, stop)

    def _loop_stop(self, state: TurnState, agent: AgentDefinition, calls: list[ToolCall]) -> LoopStop | None:
        """The first loop limit a finished tool step reached, if any."""
        limits = state.limits
        done = state.step + 1
        condition = stopping.condition_stop(state, calls)
        if condition is not None:
            stop, state.stop_detail = condition
            return stop
        if done >= limits.max_steps:
            return LoopStop.MAX_STEPS
        if limits.max_tokens is not None and state.usage.total_tokens + self._answer_reserve(state, agent) >= (
            limits.max_tokens
        ):
            return LoopStop.TOKEN_BUDGET
        if self._over_wall_clock(state):
            return LoopStop.WALL_CLOCK_BUDGET
        return None

    @staticmethod
    def _answer_reserve(state: TurnState, agent: AgentDefinition) -> int:
        """Object mode holds back tokens for its answer step: the budget's reserve, else the last step's tokens."""
        if agent.execution_mode != "object" or state.object is not None or state.answer_due is not None:
            return 0
        if state.limits.answer_reserve_tokens is not None:
            return state.limits.answer_reserve_tokens
        return state.trace.steps[-1].usage.total_tokens if state.trace.steps else 0

    def _reserve_answer(self, state: TurnState, agent: AgentDefinition, stop: LoopStop) -> bool:
        """Object mode without an object: a limit spends one reserved answer step (tools off, schema forced)
        instead of ending the turn. False when that step was already spent or no step is left."""
        if agent.execution_mode != "object" or state.object is not None or state.answer_due is not None:
            return False
        if not self._steps_left(state):
            return False
        state.answer_due = stop
        stopping.mark(state, stop)
        return True

    @staticmethod
    def _answers_anyway(state: TurnState, agent: AgentDefinition, stop: LoopStop) -> bool:
        """A limit found before the model call (wall clock): object mode makes this step the answer step;
        the answer step (or its repair) itself always runs."""
        if agent.execution_mode != "object" or state.object is not None:
            return False
        if state.answer_due is None:
            state.answer_due = stop
        return True

    def _steps_left(self, state: TurnState) -> bool:
        return state.step + 1 < state.limits.max_steps

    def _over_wall_clock(self, state: TurnState) -> bool:
        limit = state.limits.max_wall_clock_s
        return bool(limit and state.started_at and time.time() - state.started_at > limit)

    def _advance(self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter) -> Decision:
        state.step += 1
        state.parked = None
        state.status = TurnStatus.RUNNING
        if not self._commit(state):
            return _none(StepLoss.COMMIT_LOST)
        return Decision("next", step=state.step)

    # ------------------------------------------------------------------ endings

    def _finish_limit(self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter, stop: LoopStop) -> Decision:
        state.stopped_by = stop
        stopping.mark(state, stop)
        if agent.execution_mode == "object" and state.object is None:
            return self._fail(state, emitter, f"no valid object before the loop stopped ({stop.value})")
        return self._finish(state, emitter, TurnStatus.COMPLETED, stop.finish_reason)

    def _compact(
        self,
        state: TurnState,
        agent: AgentDefinition,
        adapter: ProviderAdapter,
        request: StepRequest,
        emitter: StepEmitter,
        lease: StepLease,
    ) -> StepRequest | Decision:
        """Compaction (engine/compaction.py), stored before the model call; its summary call is a traced step."""
        started = time.monotonic()
        compactor = Compactor(
            self.rt.settings, adapter, lambda msgs: self._with_files(state, msgs), lambda: lease.should_stop
        )
        try:
            done = compactor.run(state, request)
        except ProviderError as exc:  # the summary call failed: retried like the step's own call
            self._count_failed_attempt(state, exc)
            return self._provider_failure(state, agent, emitter, exc)
        if lease.lost.is_set():
            return _none(StepLoss.LEASE_LOST)
        if lease.cancelled.is_set():
            return self._finish(state, emitter, TurnStatus.CANCELLED, FinishReason.CANCELLED)
        if done is None:
            return request
        state.compaction = done.compaction
        if done.summary_output is not None:
            usage = done.summary_output.usage
            cost = step_cost(self.rt.settings.prices, state.provider, state.model, usage)
            state.usage = state.usage + usage
            state.cost = add_costs(state.cost, cost)
            state.trace.steps.append(
                StepTrace(
                    step=state.step,
                    provider=state.provider,
                    model=state.model,
                    usage=usage,
                    cost=cost,
                    duration_s=round(time.monotonic() - started, 4),
                    stop_reason=done.summary_output.finish_reason.value,
                    raw_stop_reason=done.summary_output.raw_finish_reason,
                    kind="compaction",
                )
            )
            record_usage(state.agent, self._tenant(state), state.provider, state.model, usage, cost)
        emitter.publish(EventType.CONTEXT_COMPACTED, done.event())
        if not self._commit(state, release=False):
            return _none(StepLoss.COMMIT_LOST)
        return request.model_copy(update={"messages": self._with_files(state, view(state))})

    def _with_files(self, state: TurnState, messages: list[Message]) -> list[Message]:
        """The transcript with each file's bytes filled in (stored ones from the turn, URLs fetched)."""
        if not any(isinstance(m, UserMessage) and m.files for m in messages):
            return messages
        turns = self.rt.turns
        return attachments.resolve(
            messages,
            lambda file_id: turns.load_file(state.turn_id, file_id, state.thread_id),
            self.rt.settings,
            state.provider,
        )

    def _fail(self, state: TurnState, emitter: StepEmitter, message: str) -> Decision:
        state.error = message
        emitter.publish(EventType.ERROR, {"message": message})
        return self._finish(state, emitter, TurnStatus.FAILED, FinishReason.ERROR)

    def _finish(self, state: TurnState, emitter: StepEmitter, status: TurnStatus, reason: FinishReason) -> Decision:
        if state.failed_attempts:  # the step ended on its failed attempts: they still get their trace
            failed, state.failed_attempts = state.failed_attempts, []
            state.trace.steps.append(
                StepTrace(
                    step=state.step,
                    provider=state.provider,
                    model=state.model,
                    cost=add_costs(*(f.cost for f in failed)),
                    failed_attempts=failed,
                    retries=state.attempt,
                    stop_reason=reason.value,
                )
            )
        state.status = status
        state.finish_reason = reason
        state.finished_at = time.time()
        parked, state.parked = state.parked, None
        batch_step.forget(self.rt, state)  # a request it left parked for a provider batch is not sent
        if parked is not None:  # ended while parked: a decision arriving from now on is refused
            tracing.resume_trace(state, parked.step_trace)
            ids = [a.approval_id for a in parked.approvals]
            self.rt.approvals.cancel(ids, time.time(), f"turn {status.value}")
        if not self._commit(state):
            return _none(StepLoss.COMMIT_LOST)
        start_next = threads.turn_finished(self.rt, state)  # before turn-finish: a reader may continue at once
        TURNS.labels(state.agent, status.value).inc()
        if parked is not None:  # cancelled while parked: its approvals no longer wait for anyone
            untrack_pending(self.rt, *[a.approval_id for a in parked.approvals])
        batch = state.metadata.get("batch_id")
        ended = TurnEnd(drive=False)
        if isinstance(batch, str):  # counted, a driven batch's result written, its next item claimed for us
            item_key = str(state.metadata.get("item_key", ""))
            ended = self.rt.batches.turn_ended(batch, state, result_line(item_key, state))
        emitter.publish(
            EventType.TURN_FINISH,
            {
                "status": status.value,
                "finish_reason": reason.value,
                "stopped_by": state.stopped_by.value if state.stopped_by else None,
                "stop_detail": state.stop_detail,
                "text": state.text,
                "object": state.object,
                "usage": state.usage.model_dump(),
                "cost": state.cost,
                "error": state.error,
                "trace": state.trace.summary(),
            },
        )
        return replace(
            _none(f"turn {status.value}"),
            start=_maybe(start_next),
            batch=batch if ended.drive and isinstance(batch, str) else "",
            claim=ended.claim,
        )

    # ------------------------------------------------------------------ usage of failed attempts

    def _count_failed_attempt(self, state: TurnState, exc: ProviderError) -> None:
        """Tokens the provider reported before the call failed are billed: the turn's totals count them,
        and the step's trace lists the attempt (written with the step, or with the turn's end)."""
        usage = exc.usage
        if not isinstance(usage, Usage) or not (
            usage.total_tokens or usage.cache_read_tokens or usage.cache_write_tokens
        ):
            return
        cost = step_cost(self.rt.settings.prices, state.provider, state.model, usage)
        state.usage = state.usage + usage
        state.cost = add_costs(state.cost, cost)
        state.failed_attempts.append(
            FailedAttempt(
                attempt=state.attempt,
                usage=usage,
                cost=cost,
                error=retry_reason(exc),
                provider=state.provider,
                model=state.model,
            )
        )
        record_usage(state.agent, self._tenant(state), state.provider, state.model, usage, cost)

    def _tenant(self, state: TurnState) -> str:
        """The `tenant` label of token and cost metrics: the turn's metadata value under the configured key."""
        key = self.rt.settings.metrics_tenant_key
        value = state.metadata.get(key) if key else None
        return str(value)[:64] if value is not None else ""

    # ------------------------------------------------------------------ retries

    def _provider_failure(
        self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter, exc: ProviderError
    ) -> Decision:
        s = self.rt.settings
        emitted = emitter.emitted_content
        may_retry = exc.retryable and (not emitted or agent.retry_after_emission)
        if not may_retry:
            if emitted:
                state.text = emitter_text(emitter)
                return self._fail(state, emitter, f"provider error after content was streamed: {exc.describe()}")
            return self._fail(state, emitter, f"provider error: {exc.describe()}")
        attempt = state.attempt + 1
        if attempt >= s.retry_max_attempts:
            fallback = None if emitted else next_fallback(agent.fallbacks or s.fallbacks, state.provider, state.model)
            if fallback is not None:
                return self._fail_over(state, emitter, exc, fallback, attempt)
            return self._fail(state, emitter, f"provider error after {attempt} attempts: {exc.describe()}")
        countdown = retry_countdown(exc.retry_after_s, state.attempt, s.retry_base_s, s.retry_cap_s)
        if emitted:
            self.rt.turns.clear_emitted(state.turn_id)
            emitter.publish(EventType.STEP_RESET, {"reason": "retrying after partial output"})
        emitter.publish(
            EventType.STEP_RETRY,
            {
                "attempt": attempt,
                "countdown": countdown,
                "error": exc.message,
                "status": exc.status,
                "code": exc.code,
                "retry_after": exc.retry_after_s,
            },
        )
        state.attempt = attempt
        state.not_before = time.time() + countdown
        if state.status == TurnStatus.QUEUED:
            state.status = TurnStatus.RUNNING
        if not self._commit(state):
            return _none(StepLoss.COMMIT_LOST)
        record_retry(state.provider, state.model, exc)
        return Decision("retry", step=state.step, countdown=countdown, attempt=attempt)

    def _fail_over(
        self, state: TurnState, emitter: StepEmitter, exc: ProviderError, fallback: Fallback, attempts: int
    ) -> Decision:
        """The step's attempts are spent before any content: its next attempt (and the rest of the turn) goes
        to the next fallback. Each adapter maps the canonical transcript, so nothing else changes."""
        emitter.publish(
            EventType.STEP_RETRY,
            {
                "attempt": 0,
                "countdown": 0.0,
                "error": exc.message,
                "status": exc.status,
                "code": exc.code,
                "retry_after": exc.retry_after_s,
                "reason": f"failover after {attempts} attempts on {state.provider}/{state.model}",
                "from": {"provider": state.provider, "model": state.model},
                "fallback": fallback.model_dump(),
            },
        )
        record_retry(state.provider, state.model, exc)
        state.provider, state.model = fallback.provider, fallback.model
        state.sources["model"] = "fallback"
        state.attempt = 0
        state.not_before = None
        if state.status == TurnStatus.QUEUED:
            state.status = TurnStatus.RUNNING
        if not self._commit(state):
            return _none(StepLoss.COMMIT_LOST)
        return Decision("retry", step=state.step, countdown=0.0, attempt=0, reason="failover")

    # ------------------------------------------------------------------ approvals

    def _park(
        self,
        state: TurnState,
        agent: AgentDefinition,
        emitter: StepEmitter,
        output: StepOutput,
        trace: StepTrace,
        waiting: list[PreparedCall],
    ) -> Decision:
        rt = self.rt
        ttl = agent.approval_ttl_s or rt.settings.approval_ttl_s
        expires_at = round(time.time() + ttl, 3)
        pending: list[PendingApproval] = []
        requests = []
        for p in waiting:
            if not p.needs_approval:
                continue
            assert p.args is not None
            approval_id = new_approval_id(home(state.turn_id))
            claim = ApprovalClaim(approval_id, state.turn_id, p.call.id, p.call.name, p.args_hash, expires_at)
            rt.approvals.create(
                ApprovalRecord(
                    approval_id=approval_id,
                    turn_id=state.turn_id,
                    step=state.step,
                    tool_call_id=p.call.id,
                    tool_name=p.call.name,
                    args=p.args,
                    args_hash=p.args_hash,
                    expires_at=expires_at,
                    token=rt.signer.sign(claim),  # kept server-side: the approve paths read it from here
                )
            )
            pending.append(
                PendingApproval(
                    approval_id=approval_id,
                    tool_call_id=p.call.id,
                    tool_name=p.call.name,
                    args=p.args,
                    expires_at=expires_at,
                )
            )
            requests.append(
                {
                    "approval_id": approval_id,
                    "tool_call_id": p.call.id,
                    "tool": p.call.name,
                    "args": p.args,
                    "expires_at": expires_at,
                }
            )
        state.parked = ParkedStep(
            assistant=output.message,
            step_usage=output.usage,
            raw_stop_reason=output.raw_finish_reason,
            finish_reason=output.finish_reason,
            approvals=pending,
            client_calls=client_tools.pending(waiting, expires_at),
            step_trace=trace,
        )
        state.messages.pop()  # the assistant message is re-added with the results on resume
        state.trace.steps.pop()  # so is the step's trace (kept in `parked`), complete with the results
        state.status = TurnStatus.AWAITING_APPROVAL if pending else TurnStatus.AWAITING_TOOL_RESULTS
        if not self._commit(state):
            return _none(StepLoss.COMMIT_LOST)
        track_pending(rt, pending)  # stepq_pending_approvals counts this index
        for req in requests:
            emitter.publish(EventType.APPROVAL_REQUEST, req)
        if state.parked.client_calls:
            emitter.publish(EventType.TOOL_RESULTS_REQUEST, client_tools.request_event(state.parked.client_calls))
        return _none(f"parked ({state.status.value})")

    def _resume(self, state: TurnState, agent: AgentDefinition, emitter: StepEmitter) -> Decision:
        rt = self.rt
        parked = state.parked
        if parked is None:
            return self._fail(state, emitter, "turn was awaiting approval with no parked step")
        now = time.time()
        records = rt.approvals.get_many([a.approval_id for a in parked.approvals])
        for pending in parked.approvals:
            record = records.get(pending.approval_id)
            if record is not None and record.status == "pending":
                if now < record.expires_at:
                    return _none("approvals still pending")
                rt.approvals.expire(pending.approval_id, now)
                record.status = "expired"
                emitter.publish(
                    EventType.APPROVAL_DECISION,
                    {
                        "approval_id": pending.approval_id,
                        "tool_call_id": pending.tool_call_id,
                        "decision": "expired",
                    },
                )
        calls = parked.assistant.tool_calls
        dispatcher = self._dispatcher(state, agent, emitter, None)
        answered = client_tools.settle(parked, dispatcher, now)
        if answered is None:  # the approvals are decided; client-side results are still to come
            return self._await_tool_results(state)
        for result in answered.values():
            self._publish_result(emitter, result)
        stored = {**dispatcher.stored(calls), **answered}
        by_call = {a.tool_call_id: records.get(a.approval_id) for a in parked.approvals}
        results: list[ToolResult] = []
        edited: dict[str, dict[str, Any]] = {}  # call id -> the arguments a reviewer approved instead
        for call in calls:
            if call.id in stored:
                results.append(stored[call.id])
                continue
            if call.id not in by_call:
                results.append(dispatcher.execute(dispatcher.prepare(call)))  # not approval-gated
                continue
            record = by_call[call.id]
            prepared = dispatcher.prepare(call)
            if record is None or record.status in ("expired", "cancelled"):
                result = dispatcher.record(
                    _refusal(call, f"approval {record.status if record else 'expired'}: the tool was not run")
                )
            elif record.status == "denied":
                reason = record.reason or "no reason given"
                result = dispatcher.record(_refusal(call, f"denied by reviewer: {reason}", do_not_retry=True))
            elif record.edited_args is not None:  # approved with edited arguments: run them if their binding holds
                args = edits.verified_edit(rt.signer, record, prepared.args_hash) if prepared.error is None else None
                rerun = dispatcher.prepare(call.model_copy(update={"args": args})) if args is not None else None
                if args is not None and rerun and rerun.error is None and rerun.args_hash == record.edited_args_hash:
                    edited[call.id] = args
                    result = dispatcher.execute(rerun)
                else:
                    result = dispatcher.record(_refusal(call, "the edited approval does not verify; not run"))
            elif prepared.error is not None:  # approved, but the call cannot run now: say why, not "changed"
                result = dispatcher.record(_approved_not_runnable(call, prepared.error))
            elif prepared.args_hash == record.args_hash:
                result = dispatcher.execute(prepared)
            else:
                result = dispatcher.record(_refusal(call, "approval does not match the call's arguments; not run"))
            results.append(result)
            self._publish_result(emitter, result)
        gated = {r.tool_call_id: r for r in results if r.tool_call_id in by_call and r.tool_call_id not in stored}
        self._update_plan(state, emitter, task_plan.after_results(state.plan, calls, gated))
        state.messages.append(edits.with_args(parked.assistant, edited))
        state.messages.append(ToolResultMessage(results=results))
        state.tool_calls_made += len(calls)
        state.parked = None
        state.status = TurnStatus.RUNNING
        tracing.resume_trace(state, parked.step_trace)
        return self._after_tools(state, agent, emitter, calls)

    def _await_tool_results(self, state: TurnState) -> Decision:
        """Still parked, now only on client-side results: the status says so from here on."""
        if state.status != TurnStatus.AWAITING_TOOL_RESULTS:
            state.status = TurnStatus.AWAITING_TOOL_RESULTS
            if not self._commit(state):
                return _none(StepLoss.COMMIT_LOST)
        return _none("waiting for client-side tool results")


class _EventWriteGuard:
    """The adapter's `emit`, remembering a failed event write. An adapter may wrap whatever its stream loop
    raises into a ProviderError; a Redis outage outlasting the retry window must still surface as what it is,
    so the step is left to the sweeper and never fails the turn as `provider error after content`."""

    def __init__(self, emit: Callable[[Delta], None]) -> None:
        self._emit = emit
        self.failure: redis.RedisError | None = None

    def __call__(self, delta: Delta) -> None:
        try:
            self._emit(delta)
        except redis.RedisError as exc:
            self.failure = exc
            raise

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise StoreUnavailableError(
                f"Redis was unreachable while the step streamed: {type(self.failure).__name__}: {self.failure}"
            ) from self.failure


def _refusal(call: ToolCall, error: str, **extra: object) -> ToolResult:
    """The result of a gated call that was not run (expired, denied, or approved for other arguments)."""
    denied = ToolResultStatus.DENIED
    return ToolResult(
        tool_call_id=call.id,
        name=call.name,
        is_error=True,
        output={"error": error, "status": denied.value, **extra},
        status=denied,
    )


def _approved_not_runnable(call: ToolCall, error: ToolResult) -> ToolResult:
    """An approved call that cannot run on resume. A tool the step no longer offers (a policy made the turn
    read-only or dropped the tool since the approval) is refused as such; any other reason (its arguments no
    longer validate, the tool's breaker is open) is the prepared error's own words. Never "the arguments
    changed" for arguments that did not."""
    if error.status == ToolResultStatus.NOT_FOUND:
        reason = (
            f"approved, but {call.name} is no longer allowed for this turn "
            "(a policy or the agent's tools changed since the approval); not run"
        )
        return _refusal(call, reason, do_not_retry=True)
    return error


class _EmitterResultSink:
    """Tool results ride in the step's next event write: the next tool's settle, or the commit's trip."""

    def __init__(self, store: ToolResultStore, emitter: StepEmitter, turn_id: str) -> None:
        self._store = store
        self._emitter = emitter
        self._turn_id = turn_id

    def store(self, result: ToolResult) -> None:
        self._emitter.defer_write(*self._store.put_write(self._turn_id, result))

    def settle(self) -> None:
        self._emitter.settle()


def emitter_text(emitter: StepEmitter) -> str:
    return "".join(emitter.text_parts)
