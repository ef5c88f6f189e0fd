"""The batch driver: a submitted batch runs on the workers, not in the CLI process that submitted it.

`store_batch` puts the items into Redis at submit (one LIST element per item, written in chunks).
A batch turn's end writes the item's result, in the same script as the turn's batch counters (right after
the turn's final commit, see `stepq.store.batch_runs`): once (HSETNX), counted once, and off the in-flight
list; it then flags the driver. A driver pass (`drive`) then, holding the batch's lock:

1. on the periodic tick only, records every in-flight turn found terminal (a worker that died between its
   commit and that script; a turn found running from an earlier run that ended before it was listed);
2. submits the next items while fewer than `concurrency` are in flight. The turn is created with the
   item's idempotency key (batch, key, content hash), and the cursor moves past it only afterwards, by
   compare-and-set, fenced by the lock's token: a pass that dies mid-way, a redelivered task or two
   drivers at once create nothing twice, they find the same turn. An unchanged item whose turn finished
   in an earlier run is recorded at once as reused.

Passes are triggered by a batch turn's end (the worker that ran it drives right after, see
workers/tasks.py), by `stepq batch submit` (one task) and by the periodic tick. A trigger that finds
the lock taken leaves the wake flag set; the holder runs again while the flag is set (checked and the lock
released in one script), so no news is lost. Starting a pass, placing an item and ending a pass are one
round trip each, and each reads the next item when there is room for it.

Each turn's first step is sent as soon as its item is placed (and listed in flight), through the `send` function the Celery task
shell passes (so this module never imports Celery; without one, the pass returns them in `DrivePlan.send`),
not after the whole pass: a pass can place hundreds of items, and the turns start meanwhile. A driver's turn
counts as unsent until that send is recorded (`mark_sent`), so a driver killed between placing an item and
sending it leaves a turn the sweeper sends within a lease TTL (not after STEPQ_QUEUED_GRACE_S).

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from stepq.batches.items import BatchItem, item_idempotency_key, result_line
from stepq.errors import SubmitError
from stepq.fleet.runtime import Runtime
from stepq.models import TurnState, TurnStatus
from stepq.store.batch_runs import CLAIM, BatchClaim, PassStart
from stepq.store.connection import get_many
from stepq.turns.submit import create_turn

MAX_ITEM_BYTES = 1 << 20  # one item's JSON as stored; larger items are refused at submit
MAX_INPUT_BYTES = 256 << 20  # a whole batch's stored input; split bigger inputs into several batches
CHUNK = 500  # items per Redis round trip when storing the input
MAX_PASSES = 3  # passes one `drive` makes while news keeps coming


@dataclass
class DrivePlan:
    """What a pass did, and what the task shell does after it: send step 0 of the turns in `send` (those
    placed when `drive` was given no `send` function) on the batch queue."""

    send: list[tuple[str, str]] = field(default_factory=list)  # (turn id, priority)
    finished: bool = False
    busy: bool = False  # another driver holds the batch; it will see the wake flag
    sender: Callable[[str, str], None] | None = None  # sends step 0 of (turn id, priority) now

    def dispatch(self, turn_id: str, priority: str) -> None:
        if self.sender is not None:
            self.sender(turn_id, priority)
        else:
            self.send.append((turn_id, priority))


def store_batch(
    rt: Runtime,
    batch_id: str,
    agent: str,
    items: list[tuple[str, BatchItem | None, str | None]],
    concurrency: int,
    provider_batch: bool = False,
) -> dict[str, int]:
    """Store a batch for the driver; refuses one still running. Bad lines are recorded as failed now.
    `provider_batch`: its turns send their model requests through the provider's batch API.

    Returns counts: total, stored (items for the driver), failed (bad lines)."""
    keys, r = rt.keys, rt.redis
    record = keys.batch(batch_id)
    existing = cast(dict[str, str], r.hgetall(record))
    if existing.get("driver") == "1" and existing.get("state") == "running":
        raise SubmitError(f"batch {batch_id} is still running: follow it with `stepq batch wait {batch_id}`")
    lines: list[str] = []
    size = 0
    for key, item, _ in items:
        if item is None:
            continue
        line = json.dumps(item.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
        if len(line.encode()) > MAX_ITEM_BYTES:
            raise SubmitError(
                f"item {key!r} is {len(line.encode()):,} bytes; an item may be at most {MAX_ITEM_BYTES:,}"
            )
        size += len(line.encode())
        lines.append(line)
    if size > MAX_INPUT_BYTES:
        raise SubmitError(
            f"the input is {size:,} bytes; a submitted batch holds at most {MAX_INPUT_BYTES:,}: split it into batches"
        )
    ttl = rt.settings.event_ttl_s
    derived = [keys.batch_input(batch_id), keys.batch_results(batch_id), keys.batch_inflight(batch_id)]
    r.delete(record, keys.batch_done(batch_id), keys.batch_wake(batch_id), *derived)  # one slot: {batch_id}
    for start in range(0, len(lines), CHUNK):
        r.rpush(keys.batch_input(batch_id), *lines[start : start + CHUNK])
    failed = 0
    for key, item, error in items:
        if item is None:
            row = {"key": key, "item_hash": "", "reused": False, "status": "failed", "error": error}
            failed += rt.batches.record(batch_id, key, row, index=-1, turn_id="", reused=False)
    pipe = r.pipeline(transaction=False)
    pipe.hset(
        record,
        mapping={
            "agent": agent,
            "total": len(items),
            "stored": len(lines),
            "concurrency": concurrency,
            "provider_batch": int(provider_batch),
            "driver": 1,
            "state": "running",
            "cursor": 0,
            "submitted_at": time.time(),
        },
    )
    pipe.sadd(keys.batch_active(), batch_id)
    for key in (record, *derived):
        pipe.expire(key, ttl)
    pipe.execute()
    return {"total": len(items), "stored": len(lines), "failed": failed}


def active(rt: Runtime) -> list[str]:
    """The driven batches not finished yet."""
    return sorted(cast(set[str], rt.redis.smembers(rt.keys.batch_active())))


def wake(rt: Runtime, batch_id: str) -> bool:
    """Flag news for the batch's driver; False for a batch no driver runs (a foreground `stepq batch`)."""
    pipe = rt.redis.pipeline(transaction=False)
    pipe.hget(rt.keys.batch(batch_id), "state")
    pipe.set(rt.keys.batch_wake(batch_id), "1", ex=rt.settings.event_ttl_s)
    state, _ = pipe.execute()
    return state == "running"


def drive(
    rt: Runtime, batch_id: str, *, full_check: bool = False, send: Callable[[str, str], None] | None = None
) -> DrivePlan:
    """Run passes while the wake flag is set and this driver holds the lock, at most MAX_PASSES: on a busy
    batch news never stops, and a driver that kept going would send every item itself (the workers that
    end turns then find the lock taken and run nothing inline); news left is the next trigger's (a turn's
    end, the tick). Never raises for a bad item. `send(turn_id, priority)` sends a placed turn's first step
    and records it (`mark_sent`)."""
    plan = DrivePlan(sender=send)
    token = uuid.uuid4().hex
    start = rt.batches.take(batch_id, token, first=True)
    if start is None:
        plan.busy = True  # the holder sees the wake flag and goes again
        return plan
    passes = 0
    while start is not None:
        _pass(rt, batch_id, token, plan, full_check, start)
        full_check = False
        passes += 1
        last = passes >= MAX_PASSES and not plan.finished
        start = rt.batches.take(batch_id, token, first=False, last=last)  # news meanwhile: again, else let go
    return plan


def _pass(rt: Runtime, batch_id: str, token: str, plan: DrivePlan, full_check: bool, start: PassStart) -> None:
    keys, r = rt.keys, rt.redis
    record = start.record
    if not record:  # expired (nobody followed it for the event TTL): nothing left to drive
        r.srem(keys.batch_active(), batch_id)
    if record.get("state") != "running":
        plan.finished = record.get("state") == "finished"
        return
    in_flight, raw = start.in_flight, start.next_raw
    cursor, stored = int(record.get("cursor", 0)), int(record.get("stored", 0))
    limit = max(1, int(record.get("concurrency", 1)))
    if full_check:
        in_flight -= _collect(rt, batch_id, record, plan)
        if raw is None and cursor < stored and in_flight < limit:
            raw = cast(str | None, r.lindex(keys.batch_input(batch_id), cursor))
    # the room seen at the start, not what turns ending meanwhile free: their workers place those (and run
    # them inline); a pass that kept taking them would place every item of a busy batch itself
    room = limit - in_flight
    placed = False
    while raw is not None and room > 0:  # the item at the cursor, read while there was room for it
        item = BatchItem.model_validate_json(raw)
        moved, listed, raw = _place(rt, batch_id, record, token, cursor, item, plan)
        if not moved:
            return  # lost the lock or the cursor moved: another driver carries on
        cursor += 1
        room -= listed
        placed = True
    if cursor >= stored and in_flight == 0 and not placed:
        pipe = r.pipeline(transaction=False)
        pipe.hset(keys.batch(batch_id), mapping={"state": "finished", "finished_at": time.time()})
        pipe.srem(keys.batch_active(), batch_id)
        pipe.execute()
        _keep(rt, batch_id)  # the results stay for the event TTL from the end
        plan.finished = True


def _keep(rt: Runtime, batch_id: str) -> None:
    """Push the batch's keys' expiry to the event TTL from now."""
    keys, ttl = rt.keys, rt.settings.event_ttl_s
    pipe = rt.redis.pipeline(transaction=False)
    for key in (keys.batch(batch_id), keys.batch_input(batch_id), keys.batch_results(batch_id),
                keys.batch_inflight(batch_id), keys.batch_done(batch_id), keys.batch_created(batch_id)):  # fmt: skip
        pipe.expire(key, ttl)
    pipe.execute()


def _place(
    rt: Runtime, batch_id: str, record: dict[str, str], token: str, index: int, item: BatchItem, plan: DrivePlan
) -> tuple[bool, bool, str | None]:
    """Create item `index`'s turn (or find it), move the cursor and list the turn in flight, then send it.
    (moved, listed in flight, the next item when there is room for it); not moved: this driver must stop."""
    made = _make_turn(rt, batch_id, record["agent"], record.get("provider_batch") == "1", index, item, "")
    # listed in flight before it is sent: its end (on any worker, at once) finds the entry and writes the result
    moved, next_raw = rt.batches.advance(batch_id, token, index, made.turn_id, made.entry)
    if moved and made.send:
        plan.dispatch(made.turn_id, made.priority)
    return moved, bool(made.turn_id), next_raw


@dataclass
class _Made:
    turn_id: str  # '' when the item was recorded at once (reused or refused)
    priority: str = "batch"
    send: bool = False  # its first step still has to go out (not created before and sent by an earlier run)
    entry: str = ""  # its in-flight entry


def _make_turn(
    rt: Runtime, batch_id: str, agent: str, provider_batch: bool, index: int, item: BatchItem, listed_as: str
) -> _Made:
    """Create item `index`'s turn (or find the one an earlier run or another driver created). An item answered
    before, or refused, is recorded at once (taking `listed_as`, a claim, off the in-flight list)."""
    item_hash = item.content_hash()
    try:
        state, created = create_turn(
            rt,
            agent,
            prompt=item.prompt_text(),
            messages=item.messages,
            idempotency_key=item_idempotency_key(batch_id, item),
            metadata={**item.metadata, "batch_id": batch_id, "item_key": item.key},
            priority="batch",
            provider_batch=provider_batch,
            sent=False,  # until `send` records it: a driver dying before it leaves a turn the sweeper sends
        )
    except SubmitError as exc:
        row = {"key": item.key, "item_hash": item_hash, "reused": False, "status": "failed", "error": str(exc)}
        rt.batches.record(batch_id, item.key, row, index=index, turn_id=listed_as, reused=False)
        return _Made("")
    if state.status.terminal:  # unchanged and answered in an earlier run: not paid for again
        row = result_line(item.key, state, item_hash=item_hash, reused=True)
        rt.batches.record(batch_id, item.key, row, index=index, turn_id=listed_as, reused=True)
        return _Made("")
    if not created:
        rt.redis.hincrby(rt.keys.batch(batch_id), "reused_running", 1)
    send = created or rt.turns.never_dispatched(state.turn_id)
    return _Made(state.turn_id, state.priority, send, json.dumps([index, item.key, item_hash]))


def run_claim(rt: Runtime, claim: BatchClaim) -> tuple[str, str] | None:
    """Create the claimed item's turn and list it in the claim's place: (turn id, priority) for the caller to
    run now, or None (the item was recorded at once, its turn was already sent by an earlier run, or the tick
    took the claim over)."""
    made = _place_claim(rt, claim)
    return (made.turn_id, made.priority) if made.send else None


def _place_claim(rt: Runtime, claim: BatchClaim) -> _Made:
    """The claimed item's turn, listed in the claim's place; `send` only when this call listed it and its
    first step still has to go out. turn_id '' when the item was recorded at once (the claim left with it)."""
    item = BatchItem.model_validate_json(claim.raw)
    made = _make_turn(rt, claim.batch_id, claim.agent, claim.provider_batch, claim.index, item, claim.field)
    if made.turn_id and not rt.batches.settle(claim, made.turn_id, made.entry):
        made.send = False  # the claim is gone: whoever took it over lists and sends the turn
    return made


def _collect(rt: Runtime, batch_id: str, record: dict[str, str], plan: DrivePlan) -> int:
    """The tick's check: record the results of in-flight turns found ended whose end did not (a worker died
    between its final commit and the batch script, or the turn, found running from an earlier run, ended
    before it was listed), and place the items of claims older than a lease TTL (their worker died before
    listing the turn). Returns how many left the in-flight list; keeps the batch's keys alive."""
    removed = 0
    listed = cast(list[str], rt.redis.hkeys(rt.keys.batch_inflight(batch_id)))
    claims = [f for f in listed if f.startswith(CLAIM)]
    finished = [f for f in listed if not f.startswith(CLAIM)]
    for start in range(0, len(finished), 500):
        chunk = finished[start : start + 500]
        entries = cast(list[str | None], rt.redis.hmget(rt.keys.batch_inflight(batch_id), chunk))
        blobs = get_many(rt.redis, [rt.keys.turn(t) for t in chunk])
        for turn_id, raw_entry, blob in zip(chunk, entries, blobs, strict=True):
            if raw_entry is None:
                continue  # recorded meanwhile
            index, key, item_hash = json.loads(raw_entry)
            if blob is None:  # expired: the item cannot be answered any more
                row = {"key": key, "item_hash": item_hash, "reused": False, "status": "failed",
                       "error": f"turn {turn_id} expired before its result was collected"}  # fmt: skip
                removed += rt.batches.record(batch_id, key, row, index=index, turn_id=turn_id, reused=False)
                continue
            state = TurnState.model_validate_json(blob)
            if state.status.terminal:
                row = result_line(key, state, item_hash=item_hash)
                removed += rt.batches.record(batch_id, key, row, index=index, turn_id=turn_id, reused=False)
    stale = time.time() - rt.settings.lease_ttl_s
    for field_name in claims:
        raw_entry = cast(str | None, rt.redis.hget(rt.keys.batch_inflight(batch_id), field_name))
        if raw_entry is None or float(json.loads(raw_entry)[3]) > stale:
            continue  # settled meanwhile, or its worker may still be placing it
        index = int(field_name[len(CLAIM) :])
        raw = cast(str | None, rt.redis.lindex(rt.keys.batch_input(batch_id), index))
        if raw is None:  # the input expired under a batch left unfollowed
            continue
        claim = BatchClaim(batch_id, index, raw, record["agent"], record.get("provider_batch") == "1", False)
        made = _place_claim(rt, claim)
        removed += not made.turn_id  # recorded at once: the claim left the in-flight list with it
        if made.send:
            plan.dispatch(made.turn_id, made.priority)
    _keep(rt, batch_id)  # a long batch's keys outlive the event TTL while it runs
    return removed


def status(rt: Runtime, batch_id: str) -> dict[str, Any]:
    """Counters of a batch (driven or foreground), with how many in-flight turns wait for approvals."""
    keys, r = rt.keys, rt.redis
    raw = cast(dict[str, str], r.hgetall(keys.batch(batch_id)))
    if not raw:
        raise LookupError(f"no batch {batch_id!r} (unknown, or expired)")
    out: dict[str, Any] = {"batch_id": batch_id, "agent": raw.get("agent"), "driven": raw.get("driver") == "1"}
    for name in ("total", "created", "input_tokens", "output_tokens"):
        out[name] = int(raw.get(name, 0))
    if out["driven"]:
        out["state"] = raw.get("state", "running")
        out["done"] = int(raw.get("r_done", 0))
        out["failed"] = int(raw.get("r_failed", 0))
        out["reused"] = int(raw.get("reused", 0)) + int(raw.get("reused_running", 0))
    else:
        out["done"], out["failed"] = int(raw.get("done", 0)), int(raw.get("failed", 0))
    out["finished"] = out["done"] + out["failed"]
    awaiting = retrying = running = 0
    turn_ids = cast(list[str], r.hkeys(keys.batch_inflight(batch_id)))
    for start in range(0, len(turn_ids), 500):
        chunk = turn_ids[start : start + 500]
        for blob in get_many(r, [keys.turn(t) for t in chunk]):
            if blob is None:
                continue
            state = TurnState.model_validate_json(blob)
            if state.status == TurnStatus.AWAITING_APPROVAL:
                awaiting += 1
            elif not state.status.terminal:
                running += 1
                retrying += state.attempt > 0
    out.update(running=running, retrying=retrying, awaiting_approval=awaiting)
    return out


def results(rt: Runtime, batch_id: str) -> list[dict[str, Any]]:
    """A driven batch's result lines, one per item, in input order (bad lines first)."""
    rows = [json.loads(v) for _, v in rt.redis.hscan_iter(rt.keys.batch_results(batch_id), count=1000)]
    rows.sort(key=lambda row: row.get("_index", -1))
    for row in rows:
        row.pop("_index", None)
    return rows
