"""The listings on a real Redis Cluster (three masters): every listing script touches one slot (the tenant's),
kept right after the turn, approval or thread script that changed status, through parking, a decision,
completion, cancel, a thread, and retention. Steps are delivered in this process (no broker needed)."""

from __future__ import annotations

import time

from stepq.engine.decisions import decide_approval
from stepq.engine.runner import StepRunner
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, TurnStatus
from stepq.store.keys import Keys
from stepq.turns import listings
from stepq.turns.submit import create_turn
from stepq.turns.threads import continue_thread, create_thread
from tests.test_redis_cluster import cluster_settings, cluster_url, pytestmark  # noqa: F401  (fixtures, skip)


def _ids(page: listings.Listing) -> list[str]:
    return [getattr(item, "turn_id", None) or getattr(item, "thread_id", "") for item in page.items]


def test_listings_follow_status_changes_on_the_cluster(cluster_settings, prefix):  # noqa: F811
    rt = get_runtime(cluster_settings)
    assert rt.listings.separate
    runner = StepRunner(rt)
    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
    assert _ids(listings.list_turns(rt, "acme", status="queued")) == [state.turn_id]

    assert runner.deliver(state.turn_id, 0).action == "none"  # parked
    assert _ids(listings.list_turns(rt, "acme", status="awaiting_approval")) == [state.turn_id]
    assert listings.list_turns(rt, "acme", status="queued").items == []
    [pending] = listings.list_approvals(rt, "acme").items
    token = rt.approvals.get(pending.approval_id).token
    assert decide_approval(rt, pending.approval_id, token, True, reviewer="ops").accepted
    assert listings.list_approvals(rt, "acme").items == []
    [decided] = listings.list_approvals(rt, "acme", pending=False).items
    assert (decided.decision, decided.decided_by) == ("approved", "ops")

    assert runner.deliver(state.turn_id, 0).action == "next"
    assert runner.deliver(state.turn_id, 1).action == "none"
    assert rt.turns.load(state.turn_id).status == TurnStatus.COMPLETED
    assert _ids(listings.list_turns(rt, "acme", status="completed")) == [state.turn_id]
    assert listings.list_turns(rt, "acme", status="awaiting_approval").items == []
    assert listings.list_turns(rt, "globex").items == []

    # cancel while parked: the turn moves to cancelled and its approval to decided
    other, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
    runner.deliver(other.turn_id, 0)
    rt.turns.request_cancel(other.turn_id)
    runner.deliver(other.turn_id, 0)
    assert _ids(listings.list_turns(rt, "acme", status="cancelled")) == [other.turn_id]
    assert [a.decision for a in listings.list_approvals(rt, "acme", pending=False).items] == ["cancelled", "approved"]

    # retention: past the TTL both finished turns leave every index of the tenant
    page = rt.listings.turn_page("acme", time.time() + rt.settings.event_ttl_s + 1)
    assert page.ids == []
    keys = rt.listings.turn_keys("acme")
    assert [rt.redis.zcard(keys[0]), rt.redis.hlen(keys[1]), rt.redis.zcard(keys[2])] == [0, 0, 0]


def test_threads_are_listed_on_the_cluster(cluster_settings, prefix):  # noqa: F811
    rt = get_runtime(cluster_settings)
    thread = create_thread(rt, "rt.basic", tenant="acme", metadata={"title": "On the cluster"})
    continued = continue_thread(rt, thread.thread_id, prompt="hello", tenant="acme")
    assert [e.type for e in rt.events.read(continued.state.turn_id)][:1] == [EventType.TURN_START]
    runner = StepRunner(rt)
    assert runner.deliver(continued.state.turn_id, 0).action == "next"
    assert runner.deliver(continued.state.turn_id, 1).action == "none"
    [item] = listings.list_threads(rt, "acme").items
    assert (item.thread_id, item.title, item.turns, item.status) == (thread.thread_id, "On the cluster", 1, "idle")
    assert _ids(listings.list_turns(rt, "acme", thread=thread.thread_id)) == [continued.state.turn_id]
    assert listings.list_threads(rt, "globex").items == []
    # one slot per tenant: the listing keys share a hash tag
    keys = Keys(rt.keys.prefix)
    tags = {
        key.split("{")[1].split("}")[0] for key in [keys.listing("acme", "threads"), *rt.listings.turn_keys("acme")]
    }
    assert len(tags) == 1
