"""Stop conditions by kind: registered custom predicates (`StopWhen(custom=...)`) on the agent and in a
caller's JSON overrides, and a finish reason, `stopped_by`, `stop_detail` and trace mark for each kind.
In-process against real Redis, with the scripted model."""

from __future__ import annotations

import json
import re

import pytest

from stepq.agents.definition import AgentDefinition, LoopConfig, StopWhen
from stepq.agents.registry import AgentRegistry
from stepq.agents.stops import stop_condition
from stepq.errors import DefinitionError, OverrideError
from stepq.models import EventType, FinishReason, LoopStop, TurnStatus
from tests.agents_engine import drive, start, stored_keys
from tests.agents_stepctl import SEEN


def _finish_event(rt, turn_id):
    return [e for e in rt.events.read(turn_id) if e.type == EventType.TURN_FINISH][-1]


def test_custom_stop_ends_the_turn_after_the_step_it_names(rt, prefix):
    turn_id = start(rt, "sc.paid", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    assert state.finish_reason == FinishReason.CUSTOM_STOP
    assert state.stopped_by == LoopStop.CUSTOM
    assert state.stop_detail == "sc.billing_paid"
    assert len(state.trace.steps) == 2  # the paying step's tools ran, then the loop stopped
    first, last = state.trace.steps
    assert first.stopped_by is None
    assert (last.stopped_by, last.stop_detail) == (LoopStop.CUSTOM, "sc.billing_paid")
    finish = _finish_event(rt, turn_id)
    assert finish.data["finish_reason"] == "custom-stop"
    assert finish.data["stopped_by"] == "custom-stop"
    assert finish.data["stop_detail"] == "sc.billing_paid"
    result = state.result()
    assert result.stop_detail == "sc.billing_paid"
    assert json.loads(result.model_dump_json())["trace"]["steps"][1]["stopped_by"] == "custom-stop"


def test_the_predicate_sees_the_step_and_the_turn_so_far(rt, prefix):
    turn_id = start(rt, "sc.paid", prefix)
    drive(rt, turn_id)
    asked = SEEN[turn_id]
    assert [a["step"] for a in asked] == [0, 1]
    assert asked[0]["calls"] == ["sc_charge"]
    assert asked[0]["results"] == [{"charged": 50, "paid": False}]
    assert asked[1]["results"] == [{"charged": 150, "paid": True}]
    assert [a["tokens"] for a in asked] == [10, 20]  # the turn's usage, this step included
    assert [a["made"] for a in asked] == [1, 2]
    assert asked[0]["metadata"] == {"prefix": prefix}


def test_a_caller_adds_a_custom_stop_as_json(rt, prefix):
    state = drive(rt, start(rt, "sc.charges", prefix))
    assert state.finish_reason == FinishReason.STOP and len(state.trace.steps) == 4  # no condition: runs out

    loop = json.loads('{"stop_when": [{"custom": "sc.billing_paid"}]}')
    state = drive(rt, start(rt, "sc.charges", prefix, loop=loop))
    assert state.finish_reason == FinishReason.CUSTOM_STOP
    assert state.limits.stop_custom == ["sc.billing_paid"]
    assert len(state.trace.steps) == 2


def test_an_unknown_custom_stop_in_overrides_is_refused_and_nothing_is_stored(rt, prefix):
    with pytest.raises(OverrideError, match=re.escape("no stop condition named 'billing.nope'")) as info:
        start(rt, "sc.charges", prefix, loop={"stop_when": [{"custom": "billing.nope"}]})
    assert "sc.billing_paid" in str(info.value)  # the registered ones are listed
    with pytest.raises(OverrideError, match="dotted lowercase"):
        start(rt, "sc.charges", prefix, loop={"stop_when": [{"custom": "Not A Name"}]})
    with pytest.raises(OverrideError, match="exactly one"):
        start(rt, "sc.charges", prefix, loop={"stop_when": [{"custom": "sc.billing_paid", "step_count": 2}]})
    assert stored_keys(prefix) == []


def test_a_raising_stop_condition_fails_the_turn_naming_it(rt, prefix):
    turn_id = start(rt, "sc.broken_stop", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.FAILED
    assert state.error == "stop condition 'sc.broken' raised RuntimeError: ledger unreachable"
    assert len(state.trace.steps) == 1


def test_an_agent_naming_an_unregistered_condition_is_refused_at_load():
    agent = AgentDefinition(
        id="sc.unregistered", loop=LoopConfig(stop_when=[StopWhen(custom="sc.not_registered")]), script=[]
    )
    with pytest.raises(DefinitionError, match=re.escape("sc.unregistered: loop.stop_when: no stop condition named")):
        AgentRegistry().register(agent)


def test_a_name_cannot_be_registered_twice_by_different_functions():
    @stop_condition("sc.once")
    def first(ctx):  # pragma: no cover - never asked
        return False

    with pytest.raises(DefinitionError, match="registered twice"):

        @stop_condition("sc.once")
        def second(ctx):  # pragma: no cover - never asked
            return True

    with pytest.raises(DefinitionError, match="dotted lowercase"):
        stop_condition("Bad-Name")


def test_every_kind_of_stop_has_its_own_finish_reason(rt, prefix):
    cases = {
        "eng.stop_steps": (FinishReason.STEP_COUNT, LoopStop.STEP_COUNT, "2"),
        "eng.stop_tool": (FinishReason.HAS_TOOL_CALL, LoopStop.HAS_TOOL_CALL, "eng_echo"),
        "sc.paid": (FinishReason.CUSTOM_STOP, LoopStop.CUSTOM, "sc.billing_paid"),
        "eng.loop": (FinishReason.MAX_STEPS, LoopStop.MAX_STEPS, None),
        "eng.budget_tools": (FinishReason.BUDGET, LoopStop.TOOL_CALL_BUDGET, None),
        "eng.budget_tokens": (FinishReason.BUDGET, LoopStop.TOKEN_BUDGET, None),
    }
    for agent, (reason, stopped_by, detail) in cases.items():
        turn_id = start(rt, agent, prefix)
        state = drive(rt, turn_id)
        assert (state.finish_reason, state.stopped_by, state.stop_detail) == (reason, stopped_by, detail), agent
        assert state.trace.steps[-1].stopped_by == stopped_by, agent
        assert state.trace.steps[-1].stop_detail == detail, agent
        data = _finish_event(rt, turn_id).data
        assert (data["finish_reason"], data["stopped_by"], data["stop_detail"]) == (
            reason.value,
            stopped_by.value,
            detail,
        )


def test_object_mode_custom_stop_spends_the_answer_step(rt, prefix):
    state = drive(rt, start(rt, "sc.paid_object", prefix))
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.object == {"paid": True}
    assert state.stopped_by == LoopStop.CUSTOM and state.stop_detail == "sc.billing_paid"
    assert state.finish_reason == FinishReason.STOP  # the answer's own finish reason
    assert [s.stopped_by for s in state.trace.steps] == [None, LoopStop.CUSTOM, None]
