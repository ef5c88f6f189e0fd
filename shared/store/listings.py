"""Listings: which turns, approvals and threads a tenant has, newest first, without scanning Redis.

Each tenant's listing keys share one hash tag (`Keys.listing`), so one script updates or reads them all in one
Redis Cluster slot:

- turns: `turns` (every turn) and one ZSET per status, scored by creation time; `meta` (HASH turn id ->
  status, agent, thread, batch) says which status set holds a turn and filters pages; `leave` (ZSET turn id ->
  when its TTL lapses) is set when the turn ends.
- approvals: `apv:pending` (scored by creation) and `apv:decided` (scored by decision time), `apv:leave` (ZSET
  approval id -> when its record expires).
- threads: `threads` scored by last activity (a thread expires `thread_ttl_s` after it).

Retention is exact and bounded: every write and every page read first drops up to `TRIM` entries whose time to
leave has passed, so an index holds live items plus at most what lapsed since the last call (tested).

On a single Redis the writes ride with the script that changes the status: the same script (approvals'
decision, threads), a MULTI around both (approval creation) or the same pipelined round trip (a step's commit,
checked against the version it wrote). On a Redis Cluster the listing slot is another slot: the same script
runs right after the change succeeded, as the sweeper's lists do (stepq.store.indexes). A page never trusts
an entry blindly: the caller reads each listed item's own record and drops what no longer matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from stepq.models import TurnState, TurnStatus
from stepq.store.keys import Keys
from stepq.store.pipelines import rider

TRIM = 100  # lapsed entries one call drops at most (bounded work per call; every call drops some)
SCAN_BUDGET = 2000  # index entries one page read examines at most while filtering (then it returns a cursor)
STATUSES = [s.value for s in TurnStatus]

# shared Lua: the status set of a status name (KEYS[4..] in TurnStatus order), and dropping lapsed turns
_TURN_LIB = (
    "local STATUSES = {"
    + ", ".join(f"'{s}'" for s in STATUSES)
    + """}
local function status_key(status)
  for i, s in ipairs(STATUSES) do if s == status then return KEYS[3 + i] end end
  return nil
end
local function drop(id)
  local meta = redis.call('HGET', KEYS[2], id)
  if meta then
    local key = status_key(string.match(meta, '^[^\\31]*'))
    if key then redis.call('ZREM', key, id) end
  end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local function trim(now, limit)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(gone) do drop(id) end
end
"""
)

# KEYS: turns, meta, leave, the status sets (TurnStatus order)[, the turn's version key: single Redis only]
# ARGV: turn id, status, created at, agent, thread, batch, leave at ('' = not ended), now, version ('' = no check)
_TURN = (
    _TURN_LIB
    + """
local n = 3 + #STATUSES
if KEYS[n + 1] and ARGV[9] ~= '' and redis.call('GET', KEYS[n + 1]) ~= ARGV[9] then return 0 end
trim(ARGV[8], __TRIM__)
local id, status = ARGV[1], ARGV[2]
local meta = redis.call('HGET', KEYS[2], id)
if meta then
  local old = string.match(meta, '^[^\\31]*')
  if old ~= status and status_key(old) then redis.call('ZREM', status_key(old), id) end
end
redis.call('ZADD', KEYS[1], ARGV[3], id)
redis.call('ZADD', status_key(status), ARGV[3], id)
redis.call('HSET', KEYS[2], id, status .. '\\31' .. ARGV[4] .. '\\31' .. ARGV[5] .. '\\31' .. ARGV[6])
if ARGV[7] ~= '' then redis.call('ZADD', KEYS[3], ARGV[7], id) else redis.call('ZREM', KEYS[3], id) end
return 1
"""
).replace("__TRIM__", str(TRIM))

# KEYS: the set to page (turns or one status set), then as _TURN (turns, meta, leave, status sets)
# ARGV: now, cursor score ('+inf' = from the newest), cursor member ('' = none), since ('-inf'), limit,
#       agent, thread, batch ('' = any), scan budget
# Returns {next cursor score or '', next cursor member or '', ids...}.
_TURN_PAGE = (
    _TURN_LIB
    + """
local source = table.remove(KEYS, 1)
trim(ARGV[1], __TRIM__)
local top, after, since, limit = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local want = {ARGV[6], ARGV[7], ARGV[8]}
local found, scanned, offset = {}, 0, 0
local budget = tonumber(ARGV[9])
local last_score, last_id = nil, nil
while #found < limit and scanned < budget do
  local rows = redis.call('ZREVRANGEBYSCORE', source, top, since, 'WITHSCORES', 'LIMIT', offset, 100)
  if #rows == 0 then return {'', '', unpack(found)} end
  offset = offset + #rows / 2
  for i = 1, #rows, 2 do
    local id, score = rows[i], rows[i + 1]
    if not (after ~= '' and score == top and id >= after) then
      scanned = scanned + 1
      last_score, last_id = score, id
      local meta = redis.call('HGET', KEYS[2], id)
      local ok = meta ~= false
      if ok then
        local fields, k = {}, 0
        for field in string.gmatch(meta .. '\\31', '([^\\31]*)\\31') do k = k + 1; fields[k] = field end
        for j = 1, 3 do if want[j] ~= '' and fields[j + 1] ~= want[j] then ok = false end end
      end
      if ok then table.insert(found, id) end
      if #found >= limit or scanned >= budget then break end
    end
  end
end
return {last_score or '', last_id or '', unpack(found)}
"""
).replace("__TRIM__", str(TRIM))

# KEYS: pending, decided, leave. ARGV: approval id, state ('pending' | 'decided'), score (created / decided at),
# leave at (when the record expires), now
_APPROVAL = (
    """
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[5], 'LIMIT', 0, __TRIM__)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id); redis.call('ZREM', KEYS[2], id); redis.call('ZREM', KEYS[3], id)
end
if ARGV[2] == 'pending' then
  if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end  -- decided already: a decision is final
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1
"""
).replace("__TRIM__", str(TRIM))

# KEYS: the set to page, then pending, decided, leave. ARGV: now, cursor score, cursor member, limit
# Returns {next cursor score or '', next cursor member or '', ids...}. Threads page with the same script
# (KEYS: threads, threads, threads, threads; their leave time is their score plus the TTL: ARGV[5]).
_SIMPLE_PAGE = (
    """
local source = table.remove(KEYS, 1)
local now = tonumber(ARGV[1])
if ARGV[5] then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[5]))
else
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, __TRIM__)
  for _, id in ipairs(gone) do
    redis.call('ZREM', KEYS[1], id); redis.call('ZREM', KEYS[2], id); redis.call('ZREM', KEYS[3], id)
  end
end
local top, after, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local found, offset, last_score, last_id = {}, 0, nil, nil
while #found < limit do
  local rows = redis.call('ZREVRANGEBYSCORE', source, top, '-inf', 'WITHSCORES', 'LIMIT', offset, limit + 1)
  if #rows == 0 then return {'', '', unpack(found)} end
  offset = offset + #rows / 2
  for i = 1, #rows, 2 do
    local id, score = rows[i], rows[i + 1]
    if not (after ~= '' and score == top and id >= after) then
      table.insert(found, id)
      last_score, last_id = score, id
      if #found >= limit then break end
    end
  end
end
return {last_score or '', last_id or '', unpack(found)}
"""
).replace("__TRIM__", str(TRIM))

# KEYS: threads. ARGV: thread id, last activity, ttl (threads idle longer than it are dropped: they expired)
_THREAD = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
"""

# the Lua that threads' own scripts run when given the tenant's `threads` key (single Redis): same as _THREAD
THREAD_IN_SCRIPT = """
local function list_thread(key, id, now, ttl)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', tonumber(now) - tonumber(ttl))
  redis.call('ZADD', key, now, id)
end
"""


@dataclass(frozen=True)
class Page:
    """One page of ids, newest first, and the cursor of the next page (None: this was the last)."""

    ids: list[str]
    next_cursor: str | None


def tenant_of(state: TurnState) -> str:
    """The tenant a turn belongs to: the gateway stamps `metadata.tenant` from the credential; '' for none."""
    value = state.metadata.get("tenant")
    return value if isinstance(value, str) else ""


def batch_of(state: TurnState) -> str:
    value = state.metadata.get("batch_id")
    return value if isinstance(value, str) else ""


def parse_cursor(cursor: str | None) -> tuple[str, str]:
    """A cursor is `<score>:<id>` of the last item of the previous page; ValueError names a malformed one."""
    if not cursor:
        return "+inf", ""
    if not isinstance(cursor, str):
        raise ValueError(f"invalid cursor {cursor!r}: pass the next_cursor of the previous page (a string)")
    score, sep, member = cursor.partition(":")
    try:
        finite = math.isfinite(float(score))  # Redis refuses a NaN bound
    except ValueError:
        finite = False
    if not finite or not sep or not member:
        raise ValueError(f"invalid cursor {cursor[:60]!r}: pass the next_cursor of the previous page")
    return score, member


def _page(reply: list[Any]) -> Page:
    score, member, *ids = (str(x) for x in reply)
    return Page(ids, f"{score}:{member}" if score and member else None)


class ListingStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int, thread_ttl_s: int, separate: bool) -> None:
        """`separate` (a Redis Cluster): listing keys are in another slot than what they list (see module doc)."""
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.thread_ttl_s = thread_ttl_s
        self.separate = separate
        self.turn_script: Script = rider(client.register_script(_TURN))  # version-checked: after its commit
        self._turn_page = client.register_script(_TURN_PAGE)
        self.approval_script: Script = client.register_script(_APPROVAL)
        self._simple_page = client.register_script(_SIMPLE_PAGE)
        self._thread = client.register_script(_THREAD)

    # ----------------------------------------------------------------- turns

    def turn_keys(self, tenant: str) -> list[str]:
        k = self.keys
        return [k.listing(tenant, "turns"), k.listing(tenant, "meta"), k.listing(tenant, "leave")] + [
            k.listing(tenant, f"st:{s}") for s in STATUSES
        ]

    def turn_write(self, state: TurnState, checked_version: int | None) -> tuple[Script, list[str], list[Any]]:
        """The listing update for `state` as it is stored now: a script call to send with (single Redis: after)
        the write that stored it. `checked_version`: applied only if the turn's stored version is that one (the
        commit in the same round trip took); None on a cluster, where it is sent only after a commit succeeded."""
        keys = self.turn_keys(tenant_of(state))
        version = ""
        if checked_version is not None and not self.separate:
            keys = [*keys, self.keys.version(state.turn_id)]
            version = str(checked_version)
        leave = f"{(state.finished_at or state.updated_at) + self.ttl_s:.6f}" if state.status.terminal else ""
        args = [
            state.turn_id,
            state.status.value,
            f"{state.created_at:.6f}",
            state.agent,
            state.thread_id or "",
            batch_of(state),
            leave,
            f"{state.updated_at:.6f}",
            version,
        ]
        return self.turn_script, keys, args

    def list_turn(self, state: TurnState) -> None:
        script, keys, args = self.turn_write(state, None)
        script(keys=keys, args=args)

    def turn_page(
        self,
        tenant: str,
        now: float,
        *,
        status: TurnStatus | None = None,
        agent: str | None = None,
        thread: str | None = None,
        batch: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page:
        """Ids of the tenant's turns, newest first, filtered; `cursor` continues a previous page."""
        top, after = parse_cursor(cursor)
        keys = self.turn_keys(tenant)
        source = self.keys.listing(tenant, f"st:{status.value}") if status else keys[0]
        reply = self._turn_page(
            keys=[source, *keys],
            args=[
                f"{now:.6f}",
                top,
                after,
                f"{since:.6f}" if since is not None else "-inf",
                limit,
                agent or "",
                thread or "",
                batch or "",
                SCAN_BUDGET,
            ],
        )
        return _page(reply)

    def drop_turns(self, tenant: str, turn_ids: list[str]) -> None:
        """Forget listed turns whose state is gone (expired with no end recorded: nothing else removes them)."""
        if turn_ids:
            pipe = self.client.pipeline(transaction=False)
            keys = self.turn_keys(tenant)
            for key in keys[:1] + keys[3:]:
                pipe.zrem(key, *turn_ids)
            pipe.hdel(keys[1], *turn_ids)
            pipe.execute()

    # ----------------------------------------------------------------- approvals

    def approval_keys(self, tenant: str) -> list[str]:
        k = self.keys
        return [k.listing(tenant, "apv:pending"), k.listing(tenant, "apv:decided"), k.listing(tenant, "apv:leave")]

    def approval_args(self, approval_id: str, pending: bool, at: float, leave_at: float, now: float) -> list[Any]:
        return [approval_id, "pending" if pending else "decided", f"{at:.6f}", f"{leave_at:.6f}", f"{now:.6f}"]

    def approval_page(self, tenant: str, now: float, pending: bool, cursor: str | None, limit: int) -> Page:
        top, after = parse_cursor(cursor)
        keys = self.approval_keys(tenant)
        source = keys[0] if pending else keys[1]
        reply = self._simple_page(keys=[source, *keys], args=[f"{now:.6f}", top, after, limit])
        return _page(reply)

    # ----------------------------------------------------------------- threads

    def thread_key(self, tenant: str) -> str:
        return self.keys.listing(tenant, "threads")

    def list_thread(self, tenant: str, thread_id: str, now: float) -> None:
        """A thread was used (on a cluster, after its own script; on a single Redis that script did this)."""
        self._thread(keys=[self.thread_key(tenant)], args=[thread_id, f"{now:.6f}", self.thread_ttl_s])

    def thread_page(self, tenant: str, now: float, cursor: str | None, limit: int) -> Page:
        top, after = parse_cursor(cursor)
        key = self.thread_key(tenant)
        reply = self._simple_page(keys=[key, key, key, key], args=[f"{now:.6f}", top, after, limit, self.thread_ttl_s])
        return _page(reply)
