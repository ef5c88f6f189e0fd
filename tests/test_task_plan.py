"""Visible task plans: the plan tool is shown only to agents that opt in, with guidance; a plan call
stores and streams the plan; rows that name a tool advance as that tool runs; a bad plan is a tool error."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from stepq.agents.definition import AgentDefinition
from stepq.agents.task_plan import PLAN_GUIDANCE, PLAN_TOOL
from stepq.models import EventType, PlanStatus, ToolResultStatus, TurnStatus
from tests.agents_engine import drive, start, tool_results


def _plans(rt, turn_id):
    return [
        [(s["label"], s["status"]) for s in e.data["steps"]]
        for e in rt.events.read(turn_id)
        if e.type == EventType.PLAN_UPDATE
    ]


def test_a_plan_is_stored_streamed_and_advanced_by_its_tools(rt, prefix):
    turn_id = start(rt, "plan.scripted", prefix)
    state = drive(rt, turn_id)

    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.text == "Order 42 is a kettle; stock is unknown."
    pending, running, done, failed = "pending", "running", "done", "failed"
    assert _plans(rt, turn_id) == [
        # step 0: the plan call and the lookup arrive together; the rows run, then the plan is set and advanced
        [("Look up the order", done), ("Check stock", pending), ("Answer", pending)],
        # step 1: the stock tool's row runs, then fails
        [("Look up the order", done), ("Check stock", running), ("Answer", pending)],
        [("Look up the order", done), ("Check stock", failed), ("Answer", pending)],
    ]
    assert [(s.label, s.status) for s in state.plan] == [
        ("Look up the order", PlanStatus.DONE),
        ("Check stock", PlanStatus.FAILED),
        ("Answer", PlanStatus.PENDING),
    ]
    assert state.result().plan == state.plan
    results = tool_results(state)
    assert results["call_0_0"].name == PLAN_TOOL and results["call_0_0"].output == {"ok": True, "steps": 3}


def test_the_plan_tool_and_guidance_are_shown_only_to_agents_that_opt_in(rt, prefix):
    with_plan = drive(rt, start(rt, "plan.sees", prefix))
    seen = json.loads(with_plan.text)
    assert seen["tools"] == ["plan_lookup", PLAN_TOOL]
    assert seen["system"] == "You help with orders.\n\n" + PLAN_GUIDANCE

    without = json.loads(drive(rt, start(rt, "plan.sees_without_plan", prefix)).text)
    assert without == {"tools": ["plan_lookup"], "system": "You help with orders."}


def test_an_invalid_plan_is_a_tool_error_and_sets_nothing(rt, prefix):
    turn_id = start(rt, "plan.bad_plan", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    [result] = tool_results(state).values()
    assert result.status == ToolResultStatus.INVALID_ARGUMENTS
    assert "at most 120 characters" in json.dumps(result.output)
    assert state.plan is None
    assert _plans(rt, turn_id) == []


def test_the_plan_tool_is_not_listed_by_hand():
    with pytest.raises(ValidationError, match="added by task_plan=True"):
        AgentDefinition(id="plan.listed", allowed_tools=[PLAN_TOOL])
