"""The sweeper's lists kept in step around the scripts (how a Redis Cluster runs them), on real Redis.

A commit's list update comes after its script, in a separate call; these tests put another process's update
in that gap (a decision listing a parked turn, a later commit taking a finished turn off) and check the late
update never undoes it. They run on a single Redis with the cluster's protocol switched on, and on the real
3-master cluster (tests/test_redis_cluster.py calls the same checks).
"""

from __future__ import annotations

import dataclasses

from stepq.engine.decisions import decide_approval, sweep
from stepq.engine.runner import StepRunner
from stepq.fleet.runtime import Runtime
from stepq.models import EventType, FinishReason, TurnStatus
from stepq.store.indexes import ACTIVE, AWAITING
from stepq.store.threads import ThreadStore
from stepq.store.tool_results import ToolResultStore
from stepq.store.turns import TurnStore
from stepq.turns.submit import create_turn


def separate_lists(rt: Runtime) -> Runtime:
    """The runtime with its stores keeping the sweeper's lists around the scripts, as on a cluster."""
    turns = TurnStore(rt.redis, rt.keys, rt.settings.event_ttl_s, separate_indexes=True)
    return dataclasses.replace(
        rt,
        turns=turns,
        tool_results=ToolResultStore(rt.redis, rt.keys, turns.indexes),
        threads=ThreadStore(rt.redis, rt.keys, rt.settings.thread_ttl_s, turns.indexes),
    )


def check_a_late_park_update_keeps_a_decisions_entry(rt: Runtime, prefix: str) -> None:
    assert rt.turns.indexes.separate
    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix})
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"  # parked on a real approval
    [request] = [e for e in rt.events.read(state.turn_id) if e.type == EventType.APPROVAL_REQUEST]
    approval_id = request.data["approval_id"]
    turn = rt.turns.load(state.turn_id)
    assert turn is not None and turn.status == TurnStatus.AWAITING_APPROVAL
    turn.status = TurnStatus.RUNNING  # listed as active again, as a resumed step is
    assert rt.turns.commit(turn)
    assert rt.turns.indexes.score(ACTIVE, state.turn_id) is not None

    turn.status = TurnStatus.AWAITING_APPROVAL  # it parks again, the commit split where the runner splits it:
    write = rt.turns.prepare_commit(turn)
    reply = write.script(keys=write.keys, args=write.args)  # the park lands...
    outcome = decide_approval(rt, approval_id, rt.approvals.get(approval_id).token, True)
    assert outcome.accepted and outcome.resume == (state.turn_id, 0, "interactive")  # ...the decision lists it...
    assert rt.turns.finish_commit(write, reply)  # ...and the committing worker's list update comes only now

    assert rt.turns.indexes.score(ACTIVE, state.turn_id) is not None  # still owed a resume, still watched
    assert rt.turns.indexes.score(AWAITING, state.turn_id) is not None
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=0.0) == [(state.turn_id, 0, "interactive")]  # a lost resume is sent again


def check_a_late_refresh_never_lists_a_finished_turn(rt: Runtime, prefix: str) -> None:
    assert rt.turns.indexes.separate
    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
    running = rt.turns.load(state.turn_id)
    assert running is not None
    running.status = TurnStatus.RUNNING
    write = rt.turns.prepare_commit(running)
    reply = write.script(keys=write.keys, args=write.args)  # a commit lands, its list update is late...

    finished = rt.turns.load(state.turn_id)
    assert finished is not None and finished.status == TurnStatus.RUNNING
    finished.status, finished.finish_reason = TurnStatus.CANCELLED, FinishReason.CANCELLED
    assert rt.turns.commit(finished)  # ...the turn ends and leaves the lists...
    assert rt.turns.indexes.score(ACTIVE, state.turn_id) is None

    assert rt.turns.finish_commit(write, reply)  # ...then the late refresh of its score arrives
    assert rt.turns.indexes.score(ACTIVE, state.turn_id) is None
    assert rt.turns.indexes.score(AWAITING, state.turn_id) is None


def test_a_late_park_update_keeps_a_decisions_entry(rt, prefix):
    check_a_late_park_update_keeps_a_decisions_entry(separate_lists(rt), prefix)


def test_a_late_refresh_never_lists_a_finished_turn(rt, prefix):
    check_a_late_refresh_never_lists_a_finished_turn(separate_lists(rt), prefix)


def test_a_single_redis_keeps_the_lists_inside_its_scripts(rt, prefix):
    """On a single Redis the commit script moves the entries itself: listed, parked, finished, in one call each."""
    assert not rt.turns.indexes.separate
    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix})
    assert rt.turns.indexes.score(ACTIVE, state.turn_id) == state.updated_at
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"
    parked = rt.turns.load(state.turn_id)
    assert parked is not None and parked.parked is not None
    assert rt.turns.indexes.score(ACTIVE, state.turn_id) is None
    assert rt.turns.indexes.score(AWAITING, state.turn_id) == parked.parked.expires_at
    parked.status, parked.finish_reason = TurnStatus.CANCELLED, FinishReason.CANCELLED
    assert rt.turns.commit(parked)
    assert rt.turns.indexes.score(AWAITING, state.turn_id) is None
