"""One delivery of `run_step(turn_id, step)`: fence, lease, run the step, commit, decide what's next.

The Celery task is a thin shell around `StepRunner.deliver`: it maps the returned
`Decision` onto Celery (enqueue the next step, retry with a countdown, reschedule
itself while another worker holds the lease, or nothing). Everything durable
happens here, against Redis, so it runs the same in-process with no broker.

A step reads as its stages, each a module of its own sharing one `StepContext` (engine/context.py):
  begin           engine/begin.py       the lease's checks, the policies, the planned model call;
  resume          engine/resume.py      instead of a model call, when the step was parked on its tools;
  call the model  engine/model_call.py  compaction, then a replay, a provider batch or the online call
                                        (a failed call: engine/failure.py retries, fails over or fails);
  repair          engine/repair.py      the agent's repair_tool_call on each malformed call (if it has one);
  decide          engine/decide.py      trace the answer; a malformed retry or the final answer ...
  run tools       engine/tools_stage.py ... or the tool calls (parked on those that wait: engine/park.py);
  endings         engine/finish.py      advance, finish, fail: each one fenced commit.
Every stage returns the `Decision` the delivery ends on, or what the next stage needs. The stages call the
lifecycle points (engine/lifecycle.py) that the agent's hooks and the OpenTelemetry spans observe.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import redis

from stepq.agents import mcp as mcp_tools
from stepq.engine import begin, decide, lifecycle, model_call, repair, step_plan, structured, tracing, upgrade
from stepq.engine.context import Decision, Delivery, StepContext, emitter_text, maybe, none, worker_id
from stepq.engine.emitter import StepEmitter
from stepq.engine.finish import fail
from stepq.engine.hook_calls import HookFailedError
from stepq.engine.resume import resume
from stepq.engine.tool_exec import ProcessExitingError
from stepq.engine.tools_stage import run_tools
from stepq.errors import StoreUnavailableError
from stepq.fleet.metrics import record_step
from stepq.fleet.runtime import Runtime
from stepq.logging import bind as bind_log_context
from stepq.models import TurnState
from stepq.store.leases import StepLease
from stepq.store.turns import LeaseHeld, StepStart
from stepq.turns import threads

__all__ = ["Decision", "StepRunner", "emitter_text", "worker_id"]

log = logging.getLogger("stepq.engine")
# Redis unreachable, or the process exiting under the step: such a step is left unfinished for the sweeper
# (DESIGN.md §4.6) and another worker, never failed for it
STORE_OUTAGES = (StoreUnavailableError, redis.ConnectionError, redis.TimeoutError, ProcessExitingError)


class StepRunner:
    """Runs deliveries of run_step; each delivery gets its own lease and step context."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def deliver(self, turn_id: str, step: int) -> Decision:
        """One delivery of run_step: the lease and everything the step needs come in one round trip;
        the step is fenced by its number, and its final commit checks and releases the lease."""
        rt = self.rt
        token = rt.leases.new_token()
        start = rt.turns.begin_step(turn_id, step, token, rt.leases.ttl_ms, rt.quotas.expected(turn_id))
        if isinstance(start, LeaseHeld):  # look again just after the lease would lapse (its holder may be dead)
            countdown = min(rt.settings.effective_reschedule_countdown_s, start.remaining_s + 0.05)
            return Decision("reschedule", step=step, countdown=countdown, reason="leased")
        lease = rt.leases.adopt(turn_id, token)
        try:
            state = start.state
            if state is None:
                return none("unknown turn")
            if state.status.terminal or state.step != step:
                # a finish that committed but died before its thread hook: the hook runs again (idempotent)
                start_next = threads.turn_finished(rt, state) if state.status.terminal else None
                return replace(none("stale delivery"), priority=state.priority, start=maybe(start_next))
            now = time.time()
            if state.not_before and state.not_before > now + 0.05 and not start.cancel_requested:
                return Decision(
                    "reschedule", step=step, countdown=state.not_before - now, reason="not yet", priority=state.priority
                )
            decision = self._run(state, lease, start)
            return replace(decision, priority=state.priority, queue=decision.queue or upgrade.pinned_queue(state))
        finally:
            rt.leases.release(lease)

    def _run(self, state: TurnState, lease: StepLease, start: StepStart) -> Decision:
        rt = self.rt
        emitter = StepEmitter(rt.events, state.turn_id, state.step, rt.settings.coalesce_window_ms / 1000)
        ctx: StepContext | None = None
        try:
            with mcp_tools.step_scope():  # the step's MCP sessions (if it uses any) close with it
                bind_log_context(attempt=state.attempt)
                agent = rt.agents.get(state.agent)
                if agent is None:
                    return upgrade.agent_missing(Delivery(rt=rt, state=state, lease=lease, emitter=emitter))
                observers = lifecycle.observers_for(agent)
                ctx = StepContext(rt=rt, state=state, lease=lease, emitter=emitter, agent=agent, observers=observers)
                try:
                    return self._run_step(ctx, start)
                except HookFailedError as exc:  # a hook that opted in (`fails_turn`) raised before the commit
                    return fail(ctx, str(exc))
        except STORE_OUTAGES:
            raise  # nothing can be stored now, or this process is going: the sweeper sends the step again
        except Exception as exc:  # a bug (ours, a tool's, an adapter's) must not leave the turn leased and running
            if ctx is not None:
                ctx.drop_riding()  # settled before `_crashed` reloads the turn
            return self._crashed(Delivery(rt=rt, state=state, lease=lease, emitter=emitter), exc)
        finally:
            emitter.flush()  # anything still deferred (e.g. on a path that did not commit) goes out now

    def _crashed(self, delivery: Delivery, exc: Exception) -> Decision:
        """A step that raised: its turn fails with the error on one line (the traceback goes to the log). It
        fails from its last commit, so nothing the step left half-done is stored with the failure."""
        turn_id, step = delivery.state.turn_id, delivery.state.step
        log.error("step %s of turn %s crashed", step, turn_id, exc_info=exc)
        state = self.rt.turns.load(turn_id)
        if state is None or state.status.terminal or state.step != step:
            return none("crashed after its commit")  # what it committed stands; the sweeper sends what is unsent
        return fail(replace(delivery, state=state), f"step {step} crashed: {delivery.describe(exc)}")

    def _run_step(self, ctx: StepContext, start: StepStart) -> Decision:
        """begin → (resume | call the model → decide / run tools); every step but a resume is metered."""
        opened = begin.open_step(ctx, start)
        if opened is not None:
            return opened
        if ctx.state.status.parked:
            return resume(ctx)
        running = begin.start_running(ctx)
        if running is not None:
            return running
        state = ctx.state
        lifecycle.step_started(ctx)
        started, traced = time.monotonic(), len(state.trace.steps)
        decision = self._model_step(ctx)
        elapsed = time.monotonic() - started
        record_step(state, decision.action, decision.reason, elapsed, tracing.new_traces(state, traced), ctx.tenant())
        return decision

    @staticmethod
    def _model_step(ctx: StepContext) -> Decision:
        """Plan the call, get the answer, trace it; then retry a malformed one, finish, or run its tools."""
        started = time.monotonic()
        call = begin.plan_call(ctx)
        if isinstance(call, Decision):
            return call
        if ctx.checkpoint is None:  # over the context window's share: compact what the model sees first
            compacted = model_call.compact(ctx, call)
            if compacted is not None:
                return compacted
        output = model_call.answer(ctx, call)
        if isinstance(output, Decision):
            return output
        output, repaired = repair.repair_calls(ctx.agent, output, step_plan.callable_by_name(ctx.agent, ctx.state))
        trace = decide.record_answer(ctx, call, output, started)
        trace.repaired_calls = repaired
        malformed = decide.retry_malformed(ctx, call, output, trace)
        if malformed is not None:
            return malformed
        answer = structured.as_answer(ctx.agent, output) if ctx.agent.execution_mode == "object" else None
        if answer is not None:
            return decide.final_answer(ctx, answer)
        if not output.message.tool_calls:
            return decide.final_answer(ctx, output)
        return run_tools(ctx, call, output, trace)
