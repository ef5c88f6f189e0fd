"""Each stage of a step on its own, against real Redis: the step context's fenced commit, begin, the model
call, failures, decide, tools, park and resume, and the loop's limit checks. A stage runs on a StepContext
built as a delivery builds it (the lease taken by the step-start script, the turn's stored state)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import redis

from stepq.engine import begin, decide, emitter, model_call, stopping
from stepq.engine.begin import ModelCall
from stepq.engine.context import Decision, StepContext
from stepq.engine.decisions import decide_approval
from stepq.engine.emitter import StepEmitter
from stepq.engine.failure import count_failed_attempt, provider_failure
from stepq.engine.finish import advance
from stepq.engine.resume import resume
from stepq.engine.tools_stage import refusal, run_tools
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.models import (
    AssistantMessage,
    EventType,
    Fallback,
    FinishReason,
    LoopStop,
    StepOutput,
    StepTrace,
    TextPart,
    ToolCall,
    ToolResultMessage,
    ToolResultStatus,
    TurnStatus,
    Usage,
)
from stepq.providers.base import ProviderError
from stepq.store.turns import StepStart
from tests.agents_engine import executions, start, tool_results
from tests.conftest import make_settings

Open = Callable[[str, int], tuple[StepContext, StepStart]]


@pytest.fixture
def open_step(rt: Runtime) -> Iterator[Open]:
    """Take a turn's lease for a step as a delivery does and build its StepContext; released at teardown."""
    opened: list[StepContext] = []

    def _open(turn_id: str, step: int = 0) -> tuple[StepContext, StepStart]:
        for ctx in opened:  # a previous context on this turn lets go of its lease first
            ctx.emitter.flush()
            rt.leases.release(ctx.lease)
        token = rt.leases.new_token()
        started = rt.turns.begin_step(turn_id, step, token, rt.leases.ttl_ms)
        assert isinstance(started, StepStart) and started.state is not None
        agent = rt.agents.get(started.state.agent)
        assert agent is not None
        emitter = StepEmitter(rt.events, turn_id, step, rt.settings.coalesce_window_ms / 1000)
        lease = rt.leases.adopt(turn_id, token)
        ctx = StepContext(rt=rt, state=started.state, lease=lease, emitter=emitter, agent=agent)
        opened.append(ctx)
        return ctx, started

    yield _open
    for ctx in opened:
        ctx.emitter.flush()
        rt.leases.release(ctx.lease)


def _begun(open_step: Open, turn_id: str, step: int = 0) -> StepContext:
    """A context past begin: policies resolved, the turn running."""
    ctx, started = open_step(turn_id, step)
    assert begin.open_step(ctx, started) is None
    assert begin.start_running(ctx) is None
    return ctx


def _answered(ctx: StepContext) -> tuple[ModelCall, StepOutput, StepTrace]:
    """Plan and make the model call, and trace its answer, as the runner does."""
    call = begin.plan_call(ctx)
    assert isinstance(call, ModelCall)
    output = model_call.answer(ctx, call)
    assert isinstance(output, StepOutput)
    return call, output, decide.record_answer(ctx, call, output, time.monotonic())


def _types(rt: Runtime, turn_id: str) -> list[EventType]:
    return [e.type for e in rt.events.read(turn_id)]


# --------------------------------------------------------------------------- the step context


def test_commit_is_fenced_on_the_lease_and_carries_the_deferred_events(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx, _ = open_step(turn_id, 0)
    ctx.state.text = "kept"
    ctx.emitter.defer(EventType.STEP_FINISH, {"usage": {}, "finish_reason": "stop"})
    assert ctx.commit(release=False)  # the lease is kept: the step may commit again
    assert EventType.STEP_FINISH in _types(rt, turn_id)  # the deferred event rode the commit's round trip
    assert ctx.commit()  # the step's last commit releases the lease ...
    assert ctx.lease.released
    ctx.state.text = "late"
    assert not ctx.commit()  # ... so nothing commits under it afterwards
    assert rt.turns.load(turn_id).text == "kept"


def test_an_announced_event_is_written_by_the_commit_only_if_it_takes(rt, prefix, open_step):
    """`turn-finish` rides the finishing commit's own script: after the step's events, fanned out on the
    turn's channel, with the log's TTL kept; a commit fenced off announces nothing."""
    turn_id = start(rt, "eng.loop", prefix)
    ctx, _ = open_step(turn_id, 0)
    pubsub = rt.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(rt.keys.channel(turn_id))
    try:
        ctx.emitter.defer(EventType.STEP_FINISH, {"usage": {}, "finish_reason": "stop"})
        ctx.state.status = TurnStatus.COMPLETED
        assert ctx.commit(announce=(EventType.TURN_FINISH, {"status": "completed"}))
        events = rt.events.read(turn_id)
        assert [e.type for e in events[-2:]] == [EventType.STEP_FINISH, EventType.TURN_FINISH]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].data == {"status": "completed"} and events[-1].step == 0
        heard: list[str] = []
        for _ in range(10):  # the subscribe confirmation reads as None; then step-finish and turn-finish
            message = pubsub.get_message(timeout=5)
            if message is not None:
                heard.append(message["data"])
            if len(heard) == 2:
                break
        assert heard[-1] == rt.redis.xrange(rt.keys.events(turn_id))[-1][1]["e"]
        assert 0 < rt.redis.ttl(rt.keys.events(turn_id)) <= rt.turns.ttl_s
        last = rt.events.last_seq(turn_id)
        assert not ctx.commit(announce=(EventType.TURN_FINISH, {"status": "late"}))  # the lease is gone
        assert rt.events.last_seq(turn_id) == last and pubsub.get_message(timeout=0.2) is None
    finally:
        pubsub.close()


def test_tenant_label_reads_the_configured_metadata_key(prefix, open_step, rt):
    turn_id = start(rt, "eng.loop", prefix)
    ctx, _ = open_step(turn_id, 0)
    assert ctx.tenant() == ""  # no key configured
    ctx.rt = get_runtime(make_settings(prefix, metrics_tenant_key="prefix"))
    assert ctx.tenant() == prefix


# --------------------------------------------------------------------------- begin


def test_open_step_resolves_the_policies_and_lets_the_step_go_on(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert ctx.effective is not None and ctx.state.limits == ctx.effective.limits
    assert ctx.agent is ctx.effective.agent
    assert EventType.STEP_RESET not in _types(rt, turn_id)


def test_open_step_resets_a_redelivered_step_and_honours_a_cancel(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx, started = open_step(turn_id, 0)
    decision = begin.open_step(ctx, replace(started, emitted_step=0, cancel_requested=True))
    assert isinstance(decision, Decision) and decision.action == "none"
    assert EventType.STEP_RESET in _types(rt, turn_id)
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.CANCELLED and stored.finish_reason == FinishReason.CANCELLED


def _running_ids(rt: Runtime) -> list[str]:
    return rt.listings.turn_page("", time.time() + 1, status=TurnStatus.RUNNING).ids


def test_start_running_shows_a_queued_turn_running_with_the_steps_first_write(rt, prefix, open_step):
    """The commit that shows a queued turn running rides the step's first write (step-start and the first delta
    of its stream) instead of a round trip the model call waits for; the lease is kept, and the step's next
    commit goes on from it."""
    turn_id = start(rt, "eng.loop", prefix)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert begin.start_running(ctx) is None
    assert ctx.riding is not None
    ctx.emitter.publish(EventType.TEXT_DELTA, {"text": "first"})  # the step's first write
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.RUNNING and stored.started_at and stored.version == 1
    assert turn_id in _running_ids(rt)  # its listing moved with it
    assert not ctx.lease.released
    ctx.state.text = "done"
    assert ctx.commit(release=False)
    assert rt.turns.load(turn_id).version == 2 == ctx.state.version


@pytest.fixture
def no_flush_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deferred writes go out only with the step's own writes (the flush timer would send them when their
    window ends, at a time a loaded machine picks)."""
    monkeypatch.setattr(emitter._TIMER, "schedule", lambda when, step_emitter: None)


def test_a_riding_commit_still_queued_is_carried_by_the_next_commit(rt, prefix, open_step, no_flush_timer):
    turn_id = start(rt, "eng.loop", prefix)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert begin.start_running(ctx) is None
    ctx.state.status = TurnStatus.COMPLETED
    assert ctx.commit()
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.COMPLETED and stored.started_at
    assert stored.version == 1  # one commit: the riding one never went out
    assert turn_id not in _running_ids(rt)


def test_a_riding_commit_that_did_not_take_fails_the_next_commit(rt, prefix, open_step):
    """Someone else committed the turn before the riding commit went out: it does not take, and the step's next
    commit must not take either (its version would otherwise match the other writer's)."""
    turn_id = start(rt, "eng.loop", prefix)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert begin.start_running(ctx) is None
    other = rt.turns.load(turn_id)
    other.text = "the other writer's"
    assert rt.turns.commit(other)  # version 0 -> 1
    ctx.emitter.publish(EventType.TEXT_DELTA, {"text": "first"})  # the riding commit goes out, fenced off
    ctx.state.text = "the step's"
    assert not ctx.commit(release=False)
    stored = rt.turns.load(turn_id)
    assert stored.text == "the other writer's" and stored.version == 1


def test_a_riding_commit_lost_with_its_flush_raises_at_the_next_commit(rt, prefix, open_step, no_flush_timer):
    """A write error on the flush that carried the riding commit: the step's next commit raises it (the store
    failed) instead of going on as if the turn were stored as running."""
    turn_id = start(rt, "eng.loop", prefix)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert begin.start_running(ctx) is None
    version_key = rt.keys.version(turn_id)
    stored_version = rt.redis.get(version_key)
    rt.redis.delete(version_key)
    rt.redis.hset(version_key, "wrong", "type")  # the commit script's GET of it fails: WRONGTYPE
    try:
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            ctx.emitter.flush()
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            ctx.commit(release=False)
    finally:
        rt.redis.delete(version_key)
        rt.redis.set(version_key, stored_version)


def test_start_running_stops_a_turn_over_its_wall_clock(rt, prefix, open_step):
    turn_id = start(rt, "eng.budget_clock", prefix)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    ctx.state.started_at = time.time() - 100  # the budget is 60 s
    decision = begin.start_running(ctx)
    assert decision is not None and decision.action == "none"
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.COMPLETED and stored.stopped_by == LoopStop.WALL_CLOCK_BUDGET


def test_plan_call_offers_only_the_allowed_tools(rt, prefix, open_step):
    ctx = _begun(open_step, start(rt, "eng.whitelist", prefix))
    call = begin.plan_call(ctx)
    assert isinstance(call, ModelCall)
    assert [t.name for t in call.specs] == ["eng_echo"] == [t.name for t in call.request.tools]
    assert call.request.step == 0 and call.request.messages[-1].content == "go"


def test_plan_call_fails_the_turn_on_a_provider_nobody_registered(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    ctx.state.provider = "no-such-provider"
    decision = begin.plan_call(ctx)
    assert isinstance(decision, Decision) and decision.action == "none"
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.FAILED and "no-such-provider" in (stored.error or "")


# --------------------------------------------------------------------------- the model call and its failures


def test_answer_calls_the_model_online(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    call = begin.plan_call(ctx)
    assert isinstance(call, ModelCall)
    output = model_call.answer(ctx, call)
    assert isinstance(output, StepOutput)
    assert output.message.text == "again" and [c.name for c in output.message.tool_calls] == ["eng_count"]
    ctx.emitter.flush()
    assert EventType.STEP_START in _types(rt, turn_id)


def test_answer_replays_a_checkpoint_instead_of_asking_again(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    stored = StepOutput(
        message=AssistantMessage(parts=[TextPart(text="from before the crash")]),
        usage=Usage(),
        finish_reason=FinishReason.STOP,
    )
    ctx.checkpoint = stored
    call = begin.plan_call(ctx)
    assert isinstance(call, ModelCall)
    assert model_call.answer(ctx, call) is stored
    events = rt.events.read(turn_id)
    [step_start] = [e for e in events if e.type == EventType.STEP_START]
    assert step_start.data["replayed"] is True
    assert "".join(e.data.get("text", "") for e in events if e.type == EventType.TEXT_DELTA) == "from before the crash"


def test_a_failed_call_is_retried_with_its_attempt_committed(rt, prefix, open_step):
    turn_id = start(rt, "eng.usage_trace", prefix)  # step 0 answers 429 once
    ctx = _begun(open_step, turn_id)
    call = begin.plan_call(ctx)
    assert isinstance(call, ModelCall)
    decision = model_call.answer(ctx, call)
    assert isinstance(decision, Decision)
    assert (decision.action, decision.step, decision.attempt) == ("retry", 0, 1)
    stored = rt.turns.load(turn_id)
    assert stored.attempt == 1 and stored.not_before is not None
    assert EventType.STEP_RETRY in _types(rt, turn_id)


def test_rate_limit_prefers_the_configured_provider_model_then_provider(rt, prefix, open_step):
    ctx = _begun(open_step, start(rt, "eng.loop", prefix))
    scope, limit = model_call.rate_limit(ctx)
    assert scope == f"{ctx.state.provider}/{ctx.state.model}" and not limit.active


def test_provider_failure_fails_on_a_permanent_error(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    decision = provider_failure(ctx, ProviderError("bad request", status=400, retryable=False))
    assert decision.action == "none"
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.FAILED and (stored.error or "").startswith("provider error: ")


def test_provider_failure_fails_over_once_the_attempts_are_spent(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    ctx.agent = ctx.agent.model_copy(update={"fallbacks": [Fallback(provider="scripted", model="backup")]})
    ctx.state.attempt = rt.settings.retry_max_attempts - 1
    decision = provider_failure(ctx, ProviderError("overloaded", status=529, retryable=True))
    assert (decision.action, decision.reason, decision.attempt) == ("retry", "failover", 0)
    stored = rt.turns.load(turn_id)
    assert (stored.model, stored.attempt, stored.sources["model"]) == ("backup", 0, "fallback")


def test_a_failed_attempts_reported_usage_is_billed(rt, prefix, open_step):
    ctx = _begun(open_step, start(rt, "eng.loop", prefix))
    count_failed_attempt(ctx, ProviderError("cut", retryable=True, usage=Usage(input_tokens=5, output_tokens=2)))
    count_failed_attempt(ctx, ProviderError("nothing billed", retryable=True))
    assert ctx.state.usage.total_tokens == 7
    assert [a.usage.total_tokens for a in ctx.state.failed_attempts] == [7]


# --------------------------------------------------------------------------- decide


def test_record_answer_traces_the_step_and_resets_its_attempts(rt, prefix, open_step):
    ctx = _begun(open_step, start(rt, "eng.loop", prefix))
    ctx.state.attempt = 2
    _, output, trace = _answered(ctx)
    assert ctx.state.trace.steps[-1] is trace
    assert (trace.step, trace.tool_calls, trace.retries, trace.tools) == (0, ["eng_count"], 2, ["eng_count"])
    assert ctx.state.attempt == 0 and ctx.state.usage == output.usage
    assert trace.policy["model"].value == f"{ctx.state.provider}/{ctx.state.model}"


def test_final_answer_completes_the_turn_with_its_text(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    _, output, _ = _answered(ctx)
    decision = decide.final_answer(ctx, output)
    assert decision.action == "none" and decision.reason == "turn completed"
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.COMPLETED and stored.text == "again"
    assert _types(rt, turn_id)[-1] == EventType.TURN_FINISH


def test_after_tools_advances_or_stops_on_the_step_limit(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)  # max_steps=4
    ctx = _begun(open_step, turn_id)
    calls = [ToolCall(id="c", name="eng_count", args={"label": "x"})]
    assert decide.after_tools(ctx, calls) == Decision("next", step=1)
    assert rt.turns.load(turn_id).step == 1
    ctx = _begun(open_step, turn_id, 1)
    ctx.state.step = 3  # the last step the limit allows
    decision = decide.after_tools(ctx, calls)
    assert decision.action == "none"
    assert rt.turns.load(turn_id).stopped_by == LoopStop.MAX_STEPS


def test_advance_commits_the_next_step(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    assert advance(ctx) == Decision("next", step=1)
    assert ctx.lease.released and rt.turns.load(turn_id).step == 1


# --------------------------------------------------------------------------- tools, park, resume


def test_run_tools_executes_the_calls_and_goes_on(rt, prefix, open_step):
    turn_id = start(rt, "eng.loop", prefix)
    ctx = _begun(open_step, turn_id)
    call, output, trace = _answered(ctx)
    assert run_tools(ctx, call, output, trace) == Decision("next", step=1)
    assert executions(prefix, turn_id, "eng_count") == 1
    stored = rt.turns.load(turn_id)
    assert isinstance(stored.messages[-1], ToolResultMessage) and stored.tool_calls_made == 1
    assert stored.trace.steps[-1].calls  # the call's sizes were recorded before the commit


def test_run_tools_runs_nothing_over_the_tool_call_budget(rt, prefix, open_step):
    turn_id = start(rt, "eng.budget_tools", prefix)  # max_tool_calls=2
    ctx = _begun(open_step, turn_id)
    ctx.state.tool_calls_made = 2
    call, output, trace = _answered(ctx)
    assert run_tools(ctx, call, output, trace).action == "none"
    assert executions(prefix, turn_id, "eng_count") == 0
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.COMPLETED and stored.stopped_by == LoopStop.TOOL_CALL_BUDGET


def test_park_then_resume_runs_the_approved_call_once(rt, prefix, open_step):
    turn_id = start(rt, "eng.predicate", prefix)  # pays 50 (no approval) and 500 (needs a reviewer)
    ctx = _begun(open_step, turn_id)
    call, output, trace = _answered(ctx)
    decision = run_tools(ctx, call, output, trace)
    assert decision.action == "none" and decision.reason == "parked (awaiting_approval)"
    parked = rt.turns.load(turn_id)
    assert parked.status == TurnStatus.AWAITING_APPROVAL and executions(prefix, turn_id, "eng_pay") == 1
    [approval] = parked.parked.approvals
    assert approval.tool_call_id == "large"

    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert resume(ctx).reason == "approvals still pending"

    record = rt.approvals.get(approval.approval_id)
    assert decide_approval(rt, approval.approval_id, record.token, True).accepted
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert resume(ctx) == Decision("next", step=1)
    assert executions(prefix, turn_id, "eng_pay") == 2  # the small one was not run again
    resumed = rt.turns.load(turn_id)
    assert {r.tool_call_id for r in tool_results(resumed).values()} == {"small", "large"}
    assert resumed.trace.steps[-1].step == 0  # the parked step's trace, written once, on resume


def test_resume_turns_a_denied_approval_into_a_refusal(rt, prefix, open_step):
    turn_id = start(rt, "eng.predicate", prefix)
    ctx = _begun(open_step, turn_id)
    call, output, trace = _answered(ctx)
    run_tools(ctx, call, output, trace)
    [approval] = rt.turns.load(turn_id).parked.approvals
    token = rt.approvals.get(approval.approval_id).token
    assert decide_approval(rt, approval.approval_id, token, False, reason="too much").accepted
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert resume(ctx).action == "next"
    denied = tool_results(rt.turns.load(turn_id))["large"]
    assert denied.status == ToolResultStatus.DENIED and "too much" in denied.output["error"]
    assert executions(prefix, turn_id, "eng_pay") == 1


def test_client_side_calls_park_the_step_until_their_results_come(rt, prefix, open_step):
    turn_id = start(rt, "ct.browser", prefix)  # a server-side echo and two client-side tools
    ctx = _begun(open_step, turn_id)
    call, output, trace = _answered(ctx)
    assert run_tools(ctx, call, output, trace).reason == "parked (awaiting_tool_results)"
    stored = rt.turns.load(turn_id)
    assert stored.status == TurnStatus.AWAITING_TOOL_RESULTS and not stored.parked.approvals
    assert {c.tool_name for c in stored.parked.client_calls} == {"ct_pick_date", "ct_geolocate"}
    assert not stored.trace.steps  # the step's trace waits in `parked`, written once on resume
    assert EventType.TOOL_RESULTS_REQUEST in _types(rt, turn_id)
    ctx, started = open_step(turn_id, 0)
    assert begin.open_step(ctx, started) is None
    assert resume(ctx).reason == "waiting for client-side tool results"


def test_refusal_is_a_denied_error_result():
    result = refusal(ToolCall(id="c1", name="t", args={}), "not run", do_not_retry=True)
    assert result.is_error and result.status == ToolResultStatus.DENIED
    assert result.output == {"error": "not run", "status": "denied", "do_not_retry": True}


# --------------------------------------------------------------------------- the loop's limits


def test_loop_stop_order_and_the_reserved_answer_step(rt, prefix, open_step):
    ctx, _ = open_step(start(rt, "eng.loop", prefix), 0)
    state, calls = ctx.state, [ToolCall(id="c", name="eng_count", args={})]
    assert stopping.loop_stop(state, ctx.agent, calls) is None and stopping.steps_left(state)
    state.step = 3
    assert stopping.loop_stop(state, ctx.agent, calls) == LoopStop.MAX_STEPS and not stopping.steps_left(state)
    state.step, state.started_at = 0, time.time() - 1000  # the budget is 600 s
    assert stopping.over_wall_clock(state)
    assert stopping.loop_stop(state, ctx.agent, calls) == LoopStop.WALL_CLOCK_BUDGET
    assert not stopping.reserve_answer(state, ctx.agent, LoopStop.WALL_CLOCK_BUDGET)  # text mode: no answer step
    assert not stopping.answers_anyway(state, ctx.agent, LoopStop.WALL_CLOCK_BUDGET)
