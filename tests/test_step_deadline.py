"""The turn's wall-clock budget bounds a running step (seed 001 §24), in-process against real Redis: a
stream that would run ~30 s, or a tool that would, stops at a 1 s budget and the step ends with the budget's
stop. The tests assert what the turn ends with (its text, its tool results, its stop), not how long it took.
"""

from __future__ import annotations

import redis

from stepq.models import EventType, FinishReason, LoopStop, TurnStatus
from tests.agents_deadline import LONG_TEXT, mark_key
from tests.agents_engine import drive, start, tool_results
from tests.conftest import REDIS_URL

side = redis.Redis.from_url(REDIS_URL, decode_responses=True)
BUDGET = {"budget": {"max_wall_clock_s": 1.0}}


def test_a_stream_is_cut_at_the_deadline_and_the_turn_ends_with_what_it_streamed(rt, prefix):
    state = drive(rt, start(rt, "dl.long_stream", prefix, loop=BUDGET))
    assert state.status == TurnStatus.COMPLETED
    assert state.stopped_by == LoopStop.WALL_CLOCK_BUDGET
    assert state.finish_reason == LoopStop.WALL_CLOCK_BUDGET.finish_reason
    assert state.text and LONG_TEXT.startswith(state.text) and len(state.text) < len(LONG_TEXT)


def test_a_running_tool_is_told_to_stop_at_the_deadline_and_the_next_call_does_not_start(rt, prefix):
    turn_id = start(rt, "dl.slow_tools", prefix, loop=BUDGET)
    state = drive(rt, turn_id)
    results = tool_results(state)
    assert results["wait"].is_error
    assert results["wait"].output["error"] == "tool dl_wait stopped: the turn's wall-clock budget ran out"
    assert results["never"].output["error"] == "tool dl_never not run: the turn's wall-clock budget ran out"
    assert side.lrange(mark_key(prefix, turn_id, "never-ran"), 0, -1) == []
    # the tool's ctx.cancelled was set: it stopped early (it reports once its thread sees the flag)
    assert side.blpop([mark_key(prefix, turn_id, "stopped")], timeout=60) == (mark_key(prefix, turn_id, "stopped"), "1")
    assert state.status == TurnStatus.COMPLETED and state.stopped_by == LoopStop.WALL_CLOCK_BUDGET
    assert state.step == 0  # the step after the tools never ran: the budget ended the turn


def test_an_object_turn_cut_mid_stream_answers_in_its_reserved_step(rt, prefix):
    turn_id = start(rt, "dl.object_stream", prefix, loop=BUDGET)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.object == {"title": "answered at the deadline"}
    assert state.stopped_by == LoopStop.WALL_CLOCK_BUDGET
    resets = [e for e in rt.events.read(turn_id) if e.type == EventType.STEP_RESET]
    assert resets and "wall-clock budget" in resets[0].data["reason"]
    assert state.finish_reason != FinishReason.CANCELLED
