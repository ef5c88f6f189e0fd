"""Lifecycle hooks on AgentDefinition, on a real (in-process) Celery worker and real Redis: each fires with
its documented arguments, the finish hooks once per committed step; a raising hook is logged and counted and
the turn goes on; a hook that opted in (`fails_turn`) fails the turn with one line; `on_turn_finish` may
continue the turn's thread. (Once per committed step across a worker kill: tests/test_otel_traces.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from stepq.agents.definition import AgentDefinition
from stepq.agents.hooks import ModelRequested, StepFinished, StepStarted, ToolResulted, fails_turn
from stepq.engine.context import Decision
from stepq.fleet.metrics import HOOK_FAILURES
from stepq.models import ToolResultStatus, TurnStatus
from tests import agents_otel

WAIT = 120


def _recorded(turn_id: str) -> list[tuple[str, Any]]:
    def turn_of(info: Any) -> str:
        return str(getattr(info, "turn_id", ""))

    return [(hook, info) for hook, info in agents_otel.RECORDED if turn_of(info) == turn_id]


def test_each_hook_fires_with_its_arguments_and_the_finish_hooks_once_per_step(worker, client):
    handle = client.submit("otel_t.hooked", prompt="go")
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED, result.error
    recorded = _recorded(handle.turn_id)

    assert [hook for hook, _ in recorded] == [
        "on_step_start", "on_model_request", "on_tool_result", "on_step_finish",
        "on_step_start", "on_model_request", "on_step_finish", "on_turn_finish",
    ]  # fmt: skip
    starts = [i for h, i in recorded if h == "on_step_start"]
    assert all(isinstance(i, StepStarted) and not i.rerun for i in starts)
    assert [i.step for i in starts] == [0, 1]
    requests = [i for h, i in recorded if h == "on_model_request"]
    assert all(isinstance(i, ModelRequested) for i in requests)
    # the final request: prepare_step's system text is in it
    assert [i.request.system for i in requests] == ["Hooked.\n\nprepared for step 0", "Hooked.\n\nprepared for step 1"]
    [(_, tool)] = [(h, i) for h, i in recorded if h == "on_tool_result"]
    assert isinstance(tool, ToolResulted) and tool.call.name == "otel_quick" and tool.call.id == "call_b"
    assert tool.result.output == {"key": "b", "value": "B"} and tool.result.status == ToolResultStatus.OK
    assert tool.duration_s is not None and tool.duration_s >= 0
    finishes = [i for h, i in recorded if h == "on_step_finish"]
    assert all(isinstance(i, StepFinished) for i in finishes)
    assert [(i.step, i.text) for i in finishes] == [(0, "looking"), (1, "found")]
    assert finishes[0].tool_results == [tool.result] and finishes[1].tool_results == []
    assert finishes[0].trace == result.trace.steps[0] and finishes[0].usage == result.trace.steps[0].usage
    [(_, turn)] = [(h, i) for h, i in recorded if h == "on_turn_finish"]  # the async hook ran to its end
    assert turn.status == TurnStatus.COMPLETED and turn.text == "found"


def test_a_raising_hook_is_logged_and_counted_and_the_turn_goes_on(worker, client, caplog):
    before = HOOK_FAILURES.labels("otel_t.raising", "on_step_finish")._value.get()
    result = client.submit("otel_t.raising", prompt="go").wait(timeout=WAIT)

    assert result.status == TurnStatus.COMPLETED and result.text == "fine", result.error
    assert HOOK_FAILURES.labels("otel_t.raising", "on_step_finish")._value.get() == before + 1
    [line] = [r.getMessage() for r in caplog.records if r.name == "stepq.hooks"]
    assert line == "hook on_step_finish of agent otel_t.raising raised ValueError: hook broke; the turn goes on"


def test_a_hook_that_opted_in_fails_the_turn_with_one_line(worker, client):
    result = client.submit("otel_t.strict", prompt="go").wait(timeout=WAIT)

    assert result.status == TurnStatus.FAILED
    assert result.error == "hook on_step_start of agent otel_t.strict raised ValueError: hook broke"


def test_only_hooks_before_the_commit_may_opt_into_failing_the_turn():
    with pytest.raises(ValueError, match="on_step_finish runs after the step's commit"):
        AgentDefinition(id="otel_t.bad", on_step_finish=fails_turn(lambda info: None))


def test_on_turn_finish_may_continue_the_thread_with_a_follow_up(worker, client):
    thread = client.create_thread("otel_t.following")
    first = client.continue_thread(thread.thread_id, prompt="start")
    assert first.wait(timeout=WAIT).text == "first answer"

    def follow_up_done() -> bool:
        turns = client.get_thread(thread.thread_id).turns
        return len(turns) == 2 and turns[1].status == "completed"

    from tests.conftest import eventually

    eventually(follow_up_done, timeout=WAIT, what="the follow-up turn to complete")
    second = client.wait(client.get_thread(thread.thread_id).turns[1].turn_id, timeout=WAIT)
    assert second.text == "second answer"
    texts = [m.content for m in client.get_thread(thread.thread_id).messages if getattr(m, "role", "") == "user"]
    assert texts == ["start", "and then?"]


def test_a_fenced_off_commit_never_calls_the_finish_hooks_and_the_run_that_commits_calls_them_once(rt, prefix):
    from stepq.engine import begin, decide, lifecycle, model_call
    from stepq.engine.context import StepContext
    from stepq.engine.emitter import StepEmitter
    from stepq.engine.runner import StepRunner
    from stepq.engine.tools_stage import run_tools
    from stepq.models import StepLoss
    from stepq.store.turns import StepStart
    from stepq.turns.submit import create_turn

    turn_id = create_turn(rt, "otel_t.hooked", prompt="go")[0].turn_id
    token = rt.leases.new_token()
    started = rt.turns.begin_step(turn_id, 0, token, rt.leases.ttl_ms)
    assert isinstance(started, StepStart) and started.state is not None
    agent = rt.agents.get("otel_t.hooked")
    assert agent is not None
    emitter = StepEmitter(rt.events, turn_id, 0, rt.settings.coalesce_window_ms / 1000)
    lease = rt.leases.adopt(turn_id, token)
    ctx = StepContext(
        rt=rt, state=started.state, lease=lease, emitter=emitter, agent=agent, observers=lifecycle.observers_for(agent)
    )
    try:
        assert begin.open_step(ctx, started) is None and begin.start_running(ctx) is None
        call = begin.plan_call(ctx)
        assert isinstance(call, begin.ModelCall)
        output = model_call.answer(ctx, call)
        assert not isinstance(output, Decision)
        trace = decide.record_answer(ctx, call, output, 0.0)
        rt.redis.delete(rt.keys.lease(turn_id))  # the lease lapsed: another delivery may take the step over
        decision = run_tools(ctx, call, output, trace)
    finally:
        emitter.flush()
        rt.leases.release(lease)
    assert decision.reason == StepLoss.COMMIT_LOST
    assert [h for h, _ in _recorded(turn_id) if h in ("on_tool_result", "on_step_finish")] == []

    assert StepRunner(rt).deliver(turn_id, 0).action == "next"  # the delivery that commits step 0
    assert [(h, i.step) for h, i in _recorded(turn_id) if h in ("on_tool_result", "on_step_finish")] == [
        ("on_tool_result", 0),
        ("on_step_finish", 0),
    ]
