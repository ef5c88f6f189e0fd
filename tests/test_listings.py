"""Listings of turns, approvals and threads (stepq.store.listings, stepq.turns.listings): kept by the scripts
that change status, per tenant, newest first, paged by cursor, and bounded (a finished turn leaves with its TTL).

Each test runs real turns on real Redis through an in-process worker; a Redis Cluster variant is in
tests/test_listings_cluster.py.
"""

from __future__ import annotations

import math
import time

import pytest

from stepq.errors import SubmitError
from stepq.models import EventType, TurnStatus
from stepq.store.listings import STATUSES
from tests.conftest import eventually


def _turn_ids(listing) -> list[str]:
    return [item.turn_id for item in listing.items]


def _park(client, prefix, tenant="acme", agent="rt.approver"):
    handle = client.submit(agent, prompt="go", metadata={"prefix": prefix, "tenant": tenant})
    for event in handle.events(idle_timeout=60):
        if event.type == EventType.APPROVAL_REQUEST:
            break
    eventually(lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL, what="the turn to park")
    return handle


def _index_sizes(rt, tenant: str) -> dict[str, int]:
    keys = rt.listings.turn_keys(tenant)
    sizes = {"turns": rt.redis.zcard(keys[0]), "meta": rt.redis.hlen(keys[1]), "leave": rt.redis.zcard(keys[2])}
    for status, key in zip(STATUSES, keys[3:], strict=True):
        sizes[status] = rt.redis.zcard(key)
    return sizes


def test_turns_are_listed_through_parking_approval_and_completion(worker, client, prefix, rt):
    handle = _park(client, prefix)
    parked = client.list_turns(tenant="acme", status="awaiting_approval")
    assert _turn_ids(parked) == [handle.turn_id]
    item = parked.items[0]
    assert (item.agent, item.tenant, item.status, item.finish_reason) == (
        "rt.approver",
        "acme",
        "awaiting_approval",
        None,
    )
    assert client.list_turns(tenant="acme", status="running").items == []
    assert client.list_turns(tenant="acme", status="completed").items == []

    [approval] = client.pending_approvals(tenant="acme").items
    assert (approval.turn_id, approval.tool, approval.args, approval.state) == (
        handle.turn_id,
        "rt_side_effect",
        {"label": "gated"},
        "pending",
    )
    assert approval.agent == "rt.approver" and approval.expires_at > approval.created_at > 0
    assert "token" not in approval.model_dump_json()

    assert client.approve(approval.approval_id, True, reviewer="ops@example").wait(30)
    assert handle.wait(timeout=60).status == TurnStatus.COMPLETED
    done = client.list_turns(tenant="acme", status="completed")
    assert _turn_ids(done) == [handle.turn_id] and done.items[0].finish_reason == "stop"
    assert client.list_turns(tenant="acme", status="awaiting_approval").items == []
    # the index itself moved (not only the page's check against the stored state)
    sizes = _index_sizes(rt, "acme")
    assert sizes["awaiting_approval"] == 0 and sizes["completed"] == 1 and sizes["leave"] == 1
    assert client.pending_approvals(tenant="acme").items == []
    [decided] = client.decided_approvals(tenant="acme").items
    assert (decided.approval_id, decided.decision, decided.decided_by) == (
        approval.approval_id,
        "approved",
        "ops@example",
    )
    assert decided.decided_at >= approval.created_at


def test_a_cancelled_parked_turn_moves_to_cancelled_and_its_approval_to_decided(worker, client, prefix, rt):
    handle = _park(client, prefix)
    client.cancel(handle.turn_id)
    assert handle.wait(timeout=60).status == TurnStatus.CANCELLED
    assert _turn_ids(client.list_turns(tenant="acme", status="cancelled")) == [handle.turn_id]
    assert _index_sizes(rt, "acme")["awaiting_approval"] == 0
    assert client.pending_approvals(tenant="acme").items == []
    [decided] = client.decided_approvals(tenant="acme").items
    assert decided.decision == "cancelled"


def test_an_expired_approval_leaves_the_pending_listing(client, prefix, rt):
    from stepq.engine.decisions import sweep
    from stepq.engine.runner import StepRunner
    from stepq.turns.submit import create_turn

    state, _ = create_turn(rt, "rt.approver_expiring", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
    runner = StepRunner(rt)
    runner.deliver(state.turn_id, 0)
    [pending] = client.pending_approvals(tenant="acme").items
    assert pending.turn_id == state.turn_id
    eventually(
        lambda: (state.turn_id, 0, "interactive") in sweep(rt, queued_grace_s=300), what="a sweep to find the turn"
    )
    runner.deliver(state.turn_id, 0)
    assert client.pending_approvals(tenant="acme").items == []
    [decided] = client.decided_approvals(tenant="acme").items
    assert (decided.approval_id, decided.decision) == (pending.approval_id, "expired")
    assert rt.redis.zcard(rt.listings.approval_keys("acme")[0]) == 0  # the pending index itself, not only the page


def test_filters_by_agent_and_since_and_another_tenants_turns_never_appear(worker, client, prefix, rt):
    first = client.submit("rt.basic", prompt="a", metadata={"prefix": prefix, "tenant": "acme"})
    first.wait(timeout=60)
    cut = time.time()
    second = client.submit("rt.basic", prompt="b", metadata={"prefix": prefix, "tenant": "acme"})
    other = client.submit("rt.basic", prompt="c", metadata={"prefix": prefix, "tenant": "globex"})
    parked = _park(client, prefix)
    for h in (second, other):
        h.wait(timeout=60)
    assert _turn_ids(client.list_turns(tenant="acme")) == [parked.turn_id, second.turn_id, first.turn_id]
    assert _turn_ids(client.list_turns(tenant="acme", agent="rt.basic")) == [second.turn_id, first.turn_id]
    assert _turn_ids(client.list_turns(tenant="acme", since=cut)) == [parked.turn_id, second.turn_id]
    assert _turn_ids(client.list_turns(tenant="globex")) == [other.turn_id]
    assert client.list_turns(tenant="initech").items == []
    # each tenant's index holds only its own turns (the page's own check is a second line, not the first)
    assert (_index_sizes(rt, "acme")["turns"], _index_sizes(rt, "globex")["turns"]) == (3, 1)


def test_pages_follow_the_cursor_newest_first_without_repeats(worker, client, prefix):
    handles = [
        client.submit("rt.basic", prompt=str(i), metadata={"prefix": prefix, "tenant": "acme"}) for i in range(7)
    ]
    for h in handles:
        h.wait(timeout=60)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = client.list_turns(tenant="acme", cursor=cursor, limit=3)
        seen += _turn_ids(page)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [h.turn_id for h in reversed(handles)] and pages == 3
    # a filter pages the same way
    page = client.list_turns(tenant="acme", status="completed", limit=5)
    rest = client.list_turns(tenant="acme", status="completed", cursor=page.next_cursor, limit=5)
    assert _turn_ids(page) + _turn_ids(rest) == [h.turn_id for h in reversed(handles)]


def test_bad_listing_input_is_a_one_line_error(client):
    with pytest.raises(SubmitError, match="unknown status 'stuck'"):
        client.list_turns(status="stuck")
    with pytest.raises(SubmitError, match="limit must be an integer from 1 to 200"):
        client.list_turns(limit=500)
    with pytest.raises(SubmitError, match="invalid cursor"):
        client.list_turns(cursor="nonsense")
    # each of these reached Redis, which refused it ("min or max is not a float"), reported as Redis down
    with pytest.raises(SubmitError, match="since must be a unix time in seconds"):
        client.list_turns(since=math.nan)
    for cursor in ("nan:turn_x", "inf:turn_x"):
        with pytest.raises(SubmitError, match="invalid cursor"):
            client.list_turns(cursor=cursor)
    with pytest.raises(SubmitError, match="invalid cursor"):
        client.pending_approvals(cursor="nan:apv_x")
    with pytest.raises(SubmitError, match="invalid cursor 5"):  # not a string: was an AttributeError
        client.list_threads(cursor=5)


def test_a_finished_turn_leaves_the_indexes_when_its_ttl_lapses_and_they_stay_bounded(worker, client, prefix, rt):
    handles = [
        client.submit("rt.basic", prompt=str(i), metadata={"prefix": prefix, "tenant": "acme"}) for i in range(3)
    ]
    for h in handles:
        h.wait(timeout=60)
    parked = _park(client, prefix)
    sizes = _index_sizes(rt, "acme")
    assert sizes["turns"] == 4 and sizes["completed"] == 3 and sizes["leave"] == 3
    # a page read past the finished turns' TTL drops them from every index; the parked turn (no TTL) stays
    later = time.time() + rt.settings.event_ttl_s + 1
    page = rt.listings.turn_page("acme", later)
    assert page.ids == [parked.turn_id]
    sizes = _index_sizes(rt, "acme")
    assert sizes["turns"] == 1 and sizes["completed"] == 0 and sizes["leave"] == 0 and sizes["meta"] == 1
    assert sizes["awaiting_approval"] == 1


def test_each_write_trims_what_lapsed_so_the_index_never_grows_without_bound(prefix, rt):
    from stepq.models import TurnState

    base = dict(agent="rt.basic", provider="scripted", model="m", limits={}, metadata={"tenant": "acme"})
    ttl = rt.settings.event_ttl_s
    gap = ttl / 100  # 300 turns ending `gap` apart: three TTLs of traffic, listed as a fleet would over time
    for i in range(300):
        at = 1_000_000.0 + i * gap
        state = TurnState(
            turn_id=f"t{i}", status=TurnStatus.COMPLETED, created_at=at, updated_at=at, finished_at=at, **base
        )
        rt.listings.list_turn(state)
    # every write dropped what had lapsed by then: exactly the turns of the last TTL remain, in every index
    sizes = _index_sizes(rt, "acme")
    assert (sizes["turns"], sizes["meta"], sizes["leave"], sizes["completed"]) == (100, 100, 100, 100)


def test_threads_are_listed_by_last_activity_with_title_turns_and_status(worker, client, prefix):
    first = client.create_thread("rt.basic", tenant="acme", metadata={"title": "Billing question"})
    second = client.create_thread("rt.basic", tenant="acme")
    client.create_thread("rt.basic", tenant="globex")
    client.continue_thread(second.thread_id, prompt="Hello there\nsecond line", tenant="acme").wait(timeout=60)
    eventually(lambda: client.list_threads(tenant="acme").items[0].status == "idle", what="the thread to go idle")
    items = client.list_threads(tenant="acme").items
    assert [t.thread_id for t in items] == [second.thread_id, first.thread_id]
    assert (items[0].title, items[0].turns, items[0].agent) == ("Hello there", 1, "rt.basic")
    assert (items[1].title, items[1].turns, items[1].status) == ("Billing question", 0, "idle")
    # the thread's turn is listed with its thread
    assert [t.thread_id for t in client.list_turns(tenant="acme", thread=second.thread_id).items] == [second.thread_id]
    page = client.list_threads(tenant="acme", limit=1)
    assert [t.thread_id for t in page.items] == [second.thread_id]
    assert [t.thread_id for t in client.list_threads(tenant="acme", cursor=page.next_cursor).items] == [first.thread_id]


def test_a_page_shows_what_is_stored_even_when_an_index_entry_lags_behind(client, prefix, rt):
    """On a cluster the listing is written right after the commit: a process dying in between leaves the entry
    at the old status until the turn's next change. A page reads each turn's record, so it never shows a
    turn under a status (or a tenant) it does not have."""
    from stepq.engine.runner import StepRunner
    from stepq.turns.submit import create_turn

    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
    queued = rt.turns.load(state.turn_id)
    runner = StepRunner(rt)
    runner.deliver(state.turn_id, 0)
    runner.deliver(state.turn_id, 1)
    assert rt.turns.load(state.turn_id).status == TurnStatus.COMPLETED
    rt.listings.list_turn(queued)  # the lagging entry: the index says queued again
    assert rt.redis.zcard(rt.listings.turn_keys("acme")[3]) == 1  # st:queued holds it
    assert client.list_turns(tenant="acme", status="queued").items == []
    [item] = client.list_turns(tenant="acme").items
    assert item.status == "completed"
