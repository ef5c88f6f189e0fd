"""The batch driver: a submitted batch runs on the workers, not in the CLI process that submitted it.

`store_batch` puts the items into Redis at submit (one LIST element per item, written in chunks).
A driver pass (`drive`) then, holding the batch's lock:

1. records every turn the batch's done stream reports finished (and, on the periodic tick, every
   in-flight turn found terminal: a worker that died between its commit and the stream entry) as the
   item's result, in one script that writes each item's result once (HSETNX) and counts it once;
2. submits the next items while fewer than `concurrency` are in flight. The turn is created with the
   item's idempotency key (batch, key, content hash), and the cursor moves past it only afterwards, by
   compare-and-set, fenced by the lock's token: a pass that dies mid-way, a redelivered task or two
   drivers at once create nothing twice, they find the same turn. An unchanged item whose turn finished
   in an earlier run is recorded at once as reused.

Passes are triggered by a batch turn's end (the worker that ran it drives right after, see
workers/tasks.py), by `stepq batch submit` (one task) and by the periodic tick. A trigger that finds
the lock taken leaves the wake flag set; the holder runs again while the flag is set, so no news is lost.

Each turn's first step is sent as soon as its item is placed, through the `send` function the Celery task
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

from stepq.batch import BatchItem, item_idempotency_key, result_line
from stepq.errors import SubmitError
from stepq.models import TurnState, TurnStatus
from stepq.runtime import Runtime
from stepq.store.connection import get_many
from stepq.submit import create_turn

MAX_ITEM_BYTES = 1 << 20  # one item's JSON as stored; larger items are refused at submit
MAX_INPUT_BYTES = 256 << 20  # a whole batch's stored input; split bigger inputs into several batches
CHUNK = 500  # items per Redis round trip when storing the input
LOCK_TTL_MS = 30_000  # a driver that dies frees the batch after this long
STREAM_READ = 1000  # done-stream entries read per pass

# KEYS: results, record, inflight. ARGV: item key, result JSON, counter field, reused (0/1), turn id
# Writes the item's result once; the counters move only for the write that happened.
_RECORD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  if ARGV[5] ~= '' then redis.call('HDEL', KEYS[3], ARGV[5]) end
  return 0
end
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[2], 'reused', 1) end
if ARGV[5] ~= '' then redis.call('HDEL', KEYS[3], ARGV[5]) end
return 1
"""

# KEYS: lock, record, inflight. ARGV: token, index, turn id ('' when the item needs no in-flight entry), entry
# Moves the cursor past item `index` (only from `index`, only for the lock's holder) and lists its turn.
_ADVANCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if tonumber(redis.call('HGET', KEYS[2], 'cursor') or '0') ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
redis.call('HSET', KEYS[2], 'cursor', tonumber(ARGV[2]) + 1)
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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
            failed += _record(rt, batch_id, key, row, index=-1, turn_id="", reused=False)
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
            "stream_cursor": "0-0",
            "submitted_at": time.time(),
        },
    )
    pipe.sadd(keys.batch_active(), batch_id)
    for key in (record, *derived):
        pipe.expire(key, ttl)
    pipe.execute()
    return {"total": len(items), "stored": len(lines), "failed": failed}


def _record(
    rt: Runtime, batch_id: str, key: str, row: dict[str, Any], *, index: int, turn_id: str, reused: bool
) -> int:
    keys = rt.keys
    row = {**row, "_index": index}  # input order for `stepq batch results`; dropped from the file
    counter = "r_done" if row.get("status") == TurnStatus.COMPLETED.value else "r_failed"
    return int(
        rt.redis.eval(
            _RECORD,
            3,
            keys.batch_results(batch_id),
            keys.batch(batch_id),
            keys.batch_inflight(batch_id),
            key,
            json.dumps(row, ensure_ascii=False),
            counter,
            "1" if reused else "0",
            turn_id,
        )
    )


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
    """Run passes while the wake flag is set and this driver holds the lock. Never raises for a bad item.
    `send(turn_id, priority)` sends a placed turn's first step and records it (`mark_sent`)."""
    keys, r = rt.keys, rt.redis
    plan = DrivePlan(sender=send)
    token = uuid.uuid4().hex
    while True:
        if not r.set(keys.batch_lock(batch_id), token, nx=True, px=LOCK_TTL_MS):
            plan.busy = True
            return plan
        try:
            r.delete(keys.batch_wake(batch_id))
            _pass(rt, batch_id, token, plan, full_check)
            while r.getdel(keys.batch_wake(batch_id)):
                _pass(rt, batch_id, token, plan, False)
        finally:
            r.eval(_RELEASE, 1, keys.batch_lock(batch_id), token)
        if plan.finished or not r.exists(keys.batch_wake(batch_id)):
            return plan
        full_check = False  # news arrived between our last look and the release: go again


def _pass(rt: Runtime, batch_id: str, token: str, plan: DrivePlan, full_check: bool) -> None:
    keys, r = rt.keys, rt.redis
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(keys.batch(batch_id))
    pipe.hlen(keys.batch_inflight(batch_id))
    record, listed = cast(tuple[dict[str, str], int], tuple(pipe.execute()))
    if not record:  # expired (nobody followed it for the event TTL): nothing left to drive
        r.srem(keys.batch_active(), batch_id)
    if record.get("state") != "running":
        plan.finished = record.get("state") == "finished"
        return
    in_flight = int(listed) - _collect(rt, batch_id, record, full_check)
    cursor, stored = int(record.get("cursor", 0)), int(record.get("stored", 0))
    limit = max(1, int(record.get("concurrency", 1)))
    while cursor < stored and in_flight < limit:
        raw = cast(str | None, r.lindex(keys.batch_input(batch_id), cursor))
        if raw is None:  # the input expired under a batch left unfollowed for the event TTL
            break
        item = BatchItem.model_validate_json(raw)
        turn_id = _place(rt, batch_id, record, token, cursor, item, plan)
        if turn_id is None:
            return  # lost the lock or the cursor moved: another driver carries on
        cursor += 1
        in_flight += bool(turn_id)
    if cursor >= stored and in_flight == 0:
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
) -> str | None:
    """Create item `index`'s turn (or find it), then move the cursor. Returns the turn id to count in flight,
    '' for an item recorded at once (reused or refused), None when this driver must stop."""
    keys, r = rt.keys, rt.redis
    item_hash = item.content_hash()
    turn_id = ""
    try:
        state, created = create_turn(
            rt,
            record["agent"],
            prompt=item.prompt_text(),
            messages=item.messages,
            idempotency_key=item_idempotency_key(batch_id, item),
            metadata={**item.metadata, "batch_id": batch_id, "item_key": item.key},
            priority="batch",
            provider_batch=record.get("provider_batch") == "1",
            sent=False,  # until `send` records it: a driver dying before it leaves a turn the sweeper sends
        )
    except SubmitError as exc:
        row = {"key": item.key, "item_hash": item_hash, "reused": False, "status": "failed", "error": str(exc)}
        _record(rt, batch_id, item.key, row, index=index, turn_id="", reused=False)
    else:
        if state.status.terminal:  # unchanged and answered in an earlier run: not paid for again
            row = result_line(item.key, state, item_hash=item_hash, reused=True)
            _record(rt, batch_id, item.key, row, index=index, turn_id="", reused=True)
        else:
            turn_id = state.turn_id
            if not created:
                r.hincrby(keys.batch(batch_id), "reused_running", 1)
            if created or rt.turns.never_dispatched(state.turn_id):
                plan.dispatch(state.turn_id, state.priority)
    entry = json.dumps([index, item.key, item_hash])
    moved = int(r.eval(_ADVANCE, 3, keys.batch_lock(batch_id), keys.batch(batch_id), keys.batch_inflight(batch_id),
                       token, index, turn_id, entry))  # fmt: skip
    return turn_id if moved == 1 else None


def _collect(rt: Runtime, batch_id: str, record: dict[str, str], full_check: bool) -> int:
    """Record the results of in-flight turns that finished; returns how many left the in-flight list."""
    keys, r = rt.keys, rt.redis
    start = cursor = record.get("stream_cursor", "0-0")
    removed = 0
    finished: list[str] = []
    while True:
        entries = cast(
            list[tuple[str, dict[str, str]]],
            r.xrange(keys.batch_done(batch_id), min=f"({cursor}", max="+", count=STREAM_READ),
        )
        if not entries:
            break
        finished.extend(fields["turn_id"] for _, fields in entries)
        cursor = entries[-1][0]
    if full_check:
        finished.extend(cast(list[str], r.hkeys(keys.batch_inflight(batch_id))))
    finished = list(dict.fromkeys(finished))  # the tick's full check may list a turn the stream named too
    if finished:
        entries_raw = cast(list[str | None], r.hmget(keys.batch_inflight(batch_id), finished))
        for turn_id, raw_entry in zip(finished, entries_raw, strict=True):
            if raw_entry is None:
                continue  # not ours (any more)
            state = rt.turns.load(turn_id)
            index, key, item_hash = json.loads(raw_entry)
            if state is None:  # expired: the item cannot be answered any more
                row = {"key": key, "item_hash": item_hash, "reused": False, "status": "failed",
                       "error": f"turn {turn_id} expired before its result was collected"}  # fmt: skip
                _record(rt, batch_id, key, row, index=index, turn_id=turn_id, reused=False)
                removed += 1
            elif state.status.terminal:
                row = result_line(key, state, item_hash=item_hash)
                _record(rt, batch_id, key, row, index=index, turn_id=turn_id, reused=False)
                removed += 1
    if cursor != start:
        r.hset(keys.batch(batch_id), "stream_cursor", cursor)
    if full_check:  # on the tick: a long batch's keys outlive the event TTL while it runs
        _keep(rt, batch_id)
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
