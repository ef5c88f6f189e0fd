"""A batch's bookkeeping in Redis, one script per move: a batch turn's end, a driver pass's start (or its next
round), each item placed, a result written once. Each move is one round trip, so driving a batch costs a few
round trips per item on top of the item's own turn. All of a batch's keys share its `{batch_id}` hash tag.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, cast

import redis

from stepq.models import TurnState, TurnStatus
from stepq.store.keys import Keys

# The item at the driver's cursor when there is room for it (fewer turns in flight than the concurrency).
_NEXT_ITEM = """
local function next_item(record, inflight, input)
  local f = redis.call('HMGET', record, 'state', 'cursor', 'stored', 'concurrency')
  local cursor = tonumber(f[2] or '0')
  if f[1] ~= 'running' or cursor >= tonumber(f[3] or '0') then return false end
  if redis.call('HLEN', inflight) >= math.max(1, tonumber(f[4] or '1')) then return false end
  return redis.call('LINDEX', input, cursor)
end
"""

# Claim the item at the cursor for the caller, when the batch runs and there is room: the cursor moves past it
# and a claim entry `claim:<index>` -> [index, "", "", claimed at] holds its place in flight until the caller
# lists the item's turn instead (`settle`), or the tick re-places it (a caller that died). Answers
# {index, item, agent, provider_batch, news (the wake flag is set)} or false.
_CLAIM_NEXT = """
local function claim_next(record, inflight, input, wake, now)
  local f = redis.call('HMGET', record, 'state', 'driver', 'cursor', 'stored', 'concurrency', 'agent', 'provider_batch')
  if f[1] ~= 'running' or f[2] ~= '1' then return false end
  local cursor = tonumber(f[3] or '0')
  if cursor >= tonumber(f[4] or '0') then return false end
  if redis.call('HLEN', inflight) >= math.max(1, tonumber(f[5] or '1')) then return false end
  local raw = redis.call('LINDEX', input, cursor)
  if not raw then return false end
  redis.call('HSET', inflight, 'claim:' .. cursor, '[' .. cursor .. ',"","",' .. now .. ']')
  redis.call('HSET', record, 'cursor', cursor + 1)
  return {cursor, raw, f[6] or '', f[7] or '0', redis.call('EXISTS', wake)}
end
"""

# KEYS: record, done stream, results, inflight, wake, input.
# ARGV: turn id, item key, status, counter (done|failed), input tokens, output tokens, ttl, result counter
# (r_done|r_failed), the result line's JSON without its first fields (key, item_hash, reused), now.
# The counters and the done stream every batch has; for a driven batch's in-flight turn also its result,
# written once. Then, for a running driven batch, the next item claimed for this worker ({1, claim...}), or
# when there is none to claim the wake flag for a driver pass (1). 0: nothing to drive.
_TURN_END = (
    _CLAIM_NEXT
    + """
local record = KEYS[1]
redis.call('HINCRBY', record, ARGV[4], 1)
redis.call('HINCRBY', record, 'input_tokens', ARGV[5])
redis.call('HINCRBY', record, 'output_tokens', ARGV[6])
redis.call('EXPIRE', record, ARGV[7])
redis.call('XADD', KEYS[2], '*', 'turn_id', ARGV[1], 'key', ARGV[2], 'status', ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[7])
local entry = redis.call('HGET', KEYS[4], ARGV[1])
if entry then
  local item = cjson.decode(entry)
  local row = '{"key":' .. cjson.encode(item[2]) .. ',"item_hash":' .. cjson.encode(item[3]) ..
    ',"reused":false,"_index":' .. string.format('%d', item[1]) .. ',' .. string.sub(ARGV[9], 2)
  if redis.call('HSETNX', KEYS[3], item[2], row) == 1 then redis.call('HINCRBY', record, ARGV[8], 1) end
  redis.call('HDEL', KEYS[4], ARGV[1])
end
if redis.call('HGET', record, 'state') ~= 'running' or redis.call('HGET', record, 'driver') ~= '1' then return 0 end
local claim = claim_next(record, KEYS[4], KEYS[6], KEYS[5], ARGV[10])
if claim then return {1, claim} end
redis.call('SET', KEYS[5], '1', 'EX', ARGV[7])
return 1
"""
)

# KEYS: record, inflight, input, wake. ARGV: ttl, now. The next claim (as in _TURN_END), else the wake flag.
_CLAIM = (
    _CLAIM_NEXT
    + """
local claim = claim_next(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2])
if claim then return {1, claim} end
redis.call('SET', KEYS[4], '1', 'EX', ARGV[1])
return 0
"""
)

# KEYS: inflight. ARGV: claim field, turn id, entry. The claimed item's turn takes the claim's place in flight;
# 0 when the claim is gone (the tick re-placed it).
_SETTLE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
"""

# KEYS: lock, wake, record, inflight, input. ARGV: token, lock ttl ms, '1' to take the lock | '0' to go again |
# '2' to let go. Taking: 0 when another driver holds the lock. Going again (the holder, after a pass): news
# (the wake flag) means another pass under the same lock; none releases the lock and answers 1. Letting go
# releases the lock and leaves any news for the next trigger (a turn's end, the tick). A pass gets
# {record as a flat list, turns in flight, the item at the cursor when there is room for it}.
_TAKE = (
    _NEXT_ITEM
    + """
if ARGV[3] == '1' then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
  redis.call('DEL', KEYS[2])
elseif ARGV[3] == '2' then
  if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 1
else
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  if redis.call('DEL', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
return {redis.call('HGETALL', KEYS[3]), redis.call('HLEN', KEYS[4]), next_item(KEYS[3], KEYS[4], KEYS[5])}
"""
)

# KEYS: lock, record, inflight, input, wake. ARGV: token, index, turn id ('' when the item needs no in-flight
# entry), entry, ttl. Moves the cursor past item `index` (only from `index`, only for the lock's holder) and
# lists its turn; answers {1, the next item when there is room for it}, -1 without the lock, 0 when the
# cursor moved (a worker claimed the item): the wake flag then sends the holder round again.
_ADVANCE = (
    _NEXT_ITEM
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if tonumber(redis.call('HGET', KEYS[2], 'cursor') or '0') ~= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[5], '1', 'EX', ARGV[5])
  return 0
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
redis.call('HSET', KEYS[2], 'cursor', tonumber(ARGV[2]) + 1)
return {1, next_item(KEYS[2], KEYS[3], KEYS[4])}
"""
)

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

LOCK_TTL_MS = 30_000  # a driver that dies frees its batch after this long
_LEADING_FIELDS = ("key", "item_hash", "reused")  # the turn-end script writes these from the in-flight entry


CLAIM = "claim:"  # the in-flight field prefix of a claimed item whose turn is not listed yet


@dataclass(frozen=True)
class BatchClaim:
    """The item at a driven batch's cursor, claimed for one worker: it creates the item's turn and runs it."""

    batch_id: str
    index: int
    raw: str  # the item as stored
    agent: str
    provider_batch: bool
    news: bool  # the batch's wake flag was set: a driver pass has other work

    @property
    def field(self) -> str:
        return f"{CLAIM}{self.index}"


@dataclass(frozen=True)
class TurnEnd:
    drive: bool  # the batch's driver should make a pass
    claim: BatchClaim | None = None


def _claim(batch_id: str, reply: Any) -> BatchClaim:
    index, raw, agent, provider_batch, news = reply
    return BatchClaim(batch_id, int(index), str(raw), str(agent), provider_batch == "1", bool(news))


@dataclass
class PassStart:
    """What a driver pass starts from, read with the lock in the same round trip."""

    record: dict[str, str]
    in_flight: int
    next_raw: str | None  # the item at the cursor, when there was room for it


class BatchRunStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._turn_end = client.register_script(_TURN_END)
        self._take = client.register_script(_TAKE)
        self._advance = client.register_script(_ADVANCE)
        self._record = client.register_script(_RECORD)
        self._claim = client.register_script(_CLAIM)
        self._settle = client.register_script(_SETTLE)

    def turn_ended(self, batch_id: str, state: TurnState, result: dict[str, Any]) -> TurnEnd:
        """Count a finished batch turn and, if a driver runs its batch, store its result line (`result`, as
        `result_line` makes it) and claim the batch's next item for this worker (else flag the driver)."""
        k = self.keys
        tail = {name: value for name, value in result.items() if name not in _LEADING_FIELDS}
        completed = state.status == TurnStatus.COMPLETED
        args: list[Any] = [
            state.turn_id,
            str(state.metadata.get("item_key", "")),
            state.status.value,
            "done" if completed else "failed",
            state.usage.input_tokens,
            state.usage.output_tokens,
            self.ttl_s,
            "r_done" if completed else "r_failed",
            json.dumps(tail, ensure_ascii=False, separators=(",", ":")),
            time.time(),
        ]
        keys = [k.batch(batch_id), k.batch_done(batch_id), k.batch_results(batch_id), k.batch_inflight(batch_id),
                k.batch_wake(batch_id), k.batch_input(batch_id)]  # fmt: skip
        reply = self._turn_end(keys=keys, args=args)
        if isinstance(reply, list):
            return TurnEnd(True, _claim(batch_id, reply[1]))
        return TurnEnd(bool(reply))

    def claim_next(self, batch_id: str) -> BatchClaim | None:
        """Claim the item at the cursor for this worker; None (and the driver flagged) when there is none."""
        k = self.keys
        keys = [k.batch(batch_id), k.batch_inflight(batch_id), k.batch_input(batch_id), k.batch_wake(batch_id)]
        reply = self._claim(keys=keys, args=[self.ttl_s, time.time()])
        return _claim(batch_id, reply[1]) if isinstance(reply, list) else None

    def settle(self, claim: BatchClaim, turn_id: str, entry: str) -> bool:
        """List the claimed item's turn in place of the claim; False when the claim is gone (the tick has it)."""
        keys = [self.keys.batch_inflight(claim.batch_id)]
        return bool(self._settle(keys=keys, args=[claim.field, turn_id, entry]))

    def take(self, batch_id: str, token: str, *, first: bool, last: bool = False) -> PassStart | None:
        """Take the batch's lock (`first`) or, holding it, go again if there is news (else release it); `last`:
        release it, leaving any news. None: no pass (another driver holds the lock, or this one released it)."""
        k = self.keys
        keys = [k.batch_lock(batch_id), k.batch_wake(batch_id), k.batch(batch_id), k.batch_inflight(batch_id),
                k.batch_input(batch_id)]  # fmt: skip
        reply = self._take(keys=keys, args=[token, LOCK_TTL_MS, "1" if first else "2" if last else "0"])
        if not isinstance(reply, list):
            return None
        flat, in_flight, next_raw = cast(tuple[list[str], int, str | None], tuple(reply))
        return PassStart(dict(zip(flat[::2], flat[1::2], strict=True)), int(in_flight), next_raw)

    def advance(self, batch_id: str, token: str, index: int, turn_id: str, entry: str) -> tuple[bool, str | None]:
        """Move the cursor past item `index`, listing `turn_id` in flight. (moved, the next item when there is
        room for it); not moved: another driver has the batch (or the cursor), this one stops."""
        k = self.keys
        keys = [k.batch_lock(batch_id), k.batch(batch_id), k.batch_inflight(batch_id), k.batch_input(batch_id),
                k.batch_wake(batch_id)]  # fmt: skip
        reply = self._advance(keys=keys, args=[token, index, turn_id, entry, self.ttl_s])
        if not isinstance(reply, list):
            return False, None
        return True, cast(str | None, reply[1])

    def record(self, batch_id: str, key: str, row: dict[str, Any], *, index: int, turn_id: str, reused: bool) -> int:
        """Write an item's result line once (1 if this call wrote it); a turn id given leaves the in-flight list."""
        k = self.keys
        row = {**row, "_index": index}  # input order for `stepq batch results`; dropped from the file
        counter = "r_done" if row.get("status") == TurnStatus.COMPLETED.value else "r_failed"
        args = [key, json.dumps(row, ensure_ascii=False), counter, "1" if reused else "0", turn_id]
        keys = [k.batch_results(batch_id), k.batch(batch_id), k.batch_inflight(batch_id)]
        return int(self._record(keys=keys, args=args))
