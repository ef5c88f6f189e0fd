"""Object mode always gets its answer step: a stop condition, a budget or max_steps that cuts the tool
steps short spends one reserved step with the answer forced, and the turn ends with a valid object and
names the limit (`stopped_by`). A repair voids the invalid answer's object deltas with a `step-reset`."""

from __future__ import annotations

from typing import Any

import pytest

from stepq.models import EventType, FinishReason, LoopStop, TurnStatus
from stepq.providers.base import OUTPUT_TOOL
from tests.agents_answer import AnsCount

WAIT = 120  # generous: the machine is shared and busy


def _run(client: Any, agent: str, **kwargs: Any) -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt="count your lookups", **kwargs)
    return handle.wait(timeout=WAIT), list(handle.events())


def _forced_steps(events: list[Any]) -> list[int]:
    """Steps whose model call answered through the output tool (streamed object deltas)."""
    return sorted({e.step for e in events if e.type == EventType.OBJECT_DELTA})


@pytest.mark.parametrize(
    ("agent", "lookups", "stop"),
    [
        ("ans.step_count", 2, LoopStop.STEP_COUNT),
        ("ans.has_tool", 1, LoopStop.HAS_TOOL_CALL),
        ("ans.token_budget", 3, LoopStop.TOKEN_BUDGET),
        ("ans.token_budget_reserve", 2, LoopStop.TOKEN_BUDGET),
        ("ans.max_steps", 3, LoopStop.MAX_STEPS),
    ],
)
def test_a_limit_spends_one_answer_step_and_the_turn_has_its_object(worker, client, agent, lookups, stop):
    result, events = _run(client, agent)
    assert result.status == TurnStatus.COMPLETED, result.error
    AnsCount.model_validate(result.object)
    assert result.object["lookups"] == lookups  # tool steps run before the limit, each seen by the answer
    assert result.stopped_by == stop
    assert result.finish_reason == FinishReason.STOP  # the answer's own finish reason
    assert len(result.trace.steps) == lookups + 1  # exactly one step beyond the tool steps
    assert _forced_steps(events) == [lookups]
    [finish] = [e for e in events if e.type == EventType.TURN_FINISH]
    assert finish.data["stopped_by"] == stop.value
    starts = [e for e in events if e.type == EventType.STEP_START]
    assert OUTPUT_TOOL in starts[-1].data["tools"]


def test_token_budget_holds_back_the_reserve(worker, client):
    result, _ = _run(client, "ans.token_budget")
    tool_steps = result.trace.steps[:-1]
    spent = sum(s.usage.total_tokens for s in tool_steps)
    assert spent < 400  # the tool steps stopped before the budget was spent...
    assert spent + tool_steps[-1].usage.total_tokens >= 400  # ...because the next one would eat the reserve
    assert result.usage.total_tokens == spent + result.trace.steps[-1].usage.total_tokens


def test_tool_call_budget_refuses_the_calls_and_answers(worker, client):
    result, events = _run(client, "ans.tool_budget")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.stopped_by == LoopStop.TOOL_CALL_BUDGET
    assert result.object["lookups"] == 3  # two results and the refusal of the third call
    assert "budget" in result.object["last"]
    ran = [e for e in events if e.type == EventType.TOOL_RESULT]
    assert len(ran) == 2  # the call over budget never ran


def test_a_limit_tighter_by_override_also_gets_the_answer_step(worker, client):
    result, _ = _run(client, "ans.max_steps", loop={"stop_when": [{"step_count": 1}]})
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object["lookups"] == 1
    assert result.stopped_by == LoopStop.STEP_COUNT


def test_wall_clock_budget_answers_instead_of_failing(worker, client):
    # a wall clock of a millionth of a second is over before the second step starts, however fast
    result, events = _run(client, "ans.step_count", loop={"budget": {"max_wall_clock_s": 1e-6}})
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.stopped_by == LoopStop.WALL_CLOCK_BUDGET
    AnsCount.model_validate(result.object)
    assert len(_forced_steps(events)) == 1


def test_chat_mode_ends_at_the_limit_with_its_finish_reason(worker, client):
    result, _ = _run(client, "ans.chat_step_count")
    assert result.status == TurnStatus.COMPLETED
    assert result.finish_reason == FinishReason.STEP_COUNT
    assert result.stopped_by == LoopStop.STEP_COUNT
    assert len(result.trace.steps) == 2


def test_repair_resets_the_invalid_answers_object_deltas(worker, client):
    result, events = _run(client, "ans.repaired")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"lookups": 1, "last": "ok"}
    assert result.stopped_by == LoopStop.STEP_COUNT
    invalid_step, repair_step = _forced_steps(events)
    resets = [e for e in events if e.type == EventType.STEP_RESET]
    assert [r.step for r in resets] == [invalid_step]
    last_invalid_delta = max(e.seq for e in events if e.type == EventType.OBJECT_DELTA and e.step == invalid_step)
    assert resets[0].seq > last_invalid_delta
    assert all(e.seq > resets[0].seq for e in events if e.step == repair_step)
    repaired = "".join(e.data["text"] for e in events if e.type == EventType.OBJECT_DELTA and e.step == repair_step)
    assert AnsCount.model_validate_json(repaired).model_dump() == result.object
