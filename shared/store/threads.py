"""Thread state in Redis: a conversation's transcript, its turns, the one running now and those waiting.

A thread runs one turn at a time. Each transition is one Lua script, so two producers double-texting
the same thread, or a finish racing a new message, can never both start a turn:

- `create`:   the thread record, with its own TTL (refreshed by every later transition).
- `submit`:   store a new turn of the thread; start it when the thread is idle (its transcript is put in
              front of the new messages in the same step), else refuse it (`reject`) or queue it.
- `finish`:   a turn of the thread ended: fold what it added into the thread's transcript and start the
              next waiting turn, if any. Idempotent: a finish that runs again starts nothing new.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.commands.core import Script

from stepq.store.broker_push import BrokerPush
from stepq.store.events import Announcement
from stepq.store.indexes import ACTIVE, SweepIndexes
from stepq.store.keys import Keys
from stepq.store.listings import THREAD_IN_SCRIPT, ListingStore
from stepq.store.pipelines import run_scripts

# KEYS: thread, transcript, turns, queue
#       [, the tenant's `threads` listing: single Redis only (each script below likewise)]
# ARGV: ttl, agent, tenant, metadata json, now
_CREATE = (
    THREAD_IN_SCRIPT
    + """
redis.call('HSET', KEYS[1], 'agent', ARGV[2], 'tenant', ARGV[3], 'metadata', ARGV[4],
           'created_at', ARGV[5], 'updated_at', ARGV[5], 'running', '', 'after', '', 'base', 0)
redis.call('EXPIRE', KEYS[1], ARGV[1])
if KEYS[5] then list_thread(KEYS[5], string.match(KEYS[1], '([^:]+)$'), ARGV[5], ARGV[1]) end
return 1
"""
)

# KEYS: thread, transcript, turns, queue, turn, turn version, turn messages, the turn's thread input, the turn's
#       `active` shard, the turn's `absent` key (KEYS[9] is it on a cluster: the shard is listed around the script),
#       the tenant's `threads` listing (single Redis; else KEYS[10]), the thread's files, the turn's seq, events and
#       channel, the broker queue's list (single Redis, a first message to push; else KEYS[10])
# ARGV: policy, turn id, turn state json, now, ttl, the event log's maxlen, the `turn-start` event's body (written
#       only if the turn is stored), the first step's broker message (pushed only if the turn starts now), new
#       messages...
_SUBMIT = (
    THREAD_IN_SCRIPT
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', ''} end
local running = redis.call('HGET', KEYS[1], 'running') or ''
if running ~= '' and ARGV[1] == 'reject' then return {'busy', running} end
redis.call('SET', KEYS[5], ARGV[3])
redis.call('SET', KEYS[6], '0')
redis.call('RPUSH', KEYS[3], ARGV[2])
local outcome
if running == '' then
  local transcript = redis.call('LRANGE', KEYS[2], 0, -1)
  for i = 1, #transcript do redis.call('RPUSH', KEYS[7], transcript[i]) end
  for i = 9, #ARGV do redis.call('RPUSH', KEYS[7], ARGV[i]) end
  redis.call('HSET', KEYS[1], 'running', ARGV[2], 'base', #transcript)
  if KEYS[9] ~= KEYS[10] then redis.call('ZADD', KEYS[9], ARGV[4], ARGV[2]) end
  outcome = 'started'
else
  for i = 9, #ARGV do redis.call('RPUSH', KEYS[8], ARGV[i]) end
  redis.call('EXPIRE', KEYS[8], ARGV[5])
  if ARGV[1] == 'interrupt' then redis.call('LPUSH', KEYS[4], ARGV[2]) else redis.call('RPUSH', KEYS[4], ARGV[2]) end
  outcome = 'queued'
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[4])
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
redis.call('EXPIRE', KEYS[12], ARGV[5])  -- the thread's files live as long as its transcript
if KEYS[11] ~= KEYS[10] then list_thread(KEYS[11], string.match(KEYS[1], '([^:]+)$'), ARGV[4], ARGV[5]) end
local seq = redis.call('INCR', KEYS[13])
local payload = '{"seq":' .. seq .. ',' .. ARGV[7]
redis.call('XADD', KEYS[14], 'MAXLEN', '~', ARGV[6], seq .. '-0', 'e', payload)
redis.call('PUBLISH', KEYS[15], payload)
if outcome == 'started' and KEYS[16] ~= KEYS[10] then redis.call('LPUSH', KEYS[16], ARGV[8]) end
return {outcome, running}
"""
)

# KEYS: thread, transcript, turns, queue, next turn's messages, next turn's thread input (`Keys.absent` for none),
#       the finishing turn's thread input, the next turn's `active` shard (on a cluster, or with no next turn:
#       the same key as KEYS[9]), the finishing turn's `absent` key
# ARGV: turn id, the queue head the caller expects ('' = none), ttl, now, the turn's whole transcript...
_FINISH = (
    THREAD_IN_SCRIPT
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone', ''} end
local running = redis.call('HGET', KEYS[1], 'running') or ''
if running ~= ARGV[1] then
  if running ~= '' and redis.call('HGET', KEYS[1], 'after') == ARGV[1] then return {'again', running} end
  if redis.call('LREM', KEYS[4], 0, ARGV[1]) > 0 then  -- a waiting turn that ended (cancelled) before it ran
    redis.call('DEL', KEYS[7])
  end
  return {'stale', ''}
end
local head = redis.call('LINDEX', KEYS[4], 0) or ''
if head ~= ARGV[2] then return {'moved', head} end
local base = tonumber(redis.call('HGET', KEYS[1], 'base') or '0')
for i = 5 + base, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
local outcome = 'idle'
if head == '' then
  redis.call('HSET', KEYS[1], 'running', '', 'after', ARGV[1])
else
  redis.call('LPOP', KEYS[4])
  local transcript = redis.call('LRANGE', KEYS[2], 0, -1)
  for i = 1, #transcript do redis.call('RPUSH', KEYS[5], transcript[i]) end
  local input = redis.call('LRANGE', KEYS[6], 0, -1)
  for i = 1, #input do redis.call('RPUSH', KEYS[5], input[i]) end
  redis.call('DEL', KEYS[6])
  redis.call('HSET', KEYS[1], 'running', head, 'after', ARGV[1], 'base', #transcript)
  if KEYS[8] ~= KEYS[9] then redis.call('ZADD', KEYS[8], ARGV[4], head) end
  outcome = 'start'
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[4])
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
if KEYS[10] then list_thread(KEYS[10], string.match(KEYS[1], '([^:]+)$'), ARGV[4], ARGV[3]) end
return {outcome, head}
"""
)


@dataclass(frozen=True)
class StoredThread:
    """A thread as stored: its record, transcript (message JSON), turn ids, and the waiting turn ids."""

    thread_id: str
    agent: str
    tenant: str
    metadata: dict[str, Any]
    created_at: float
    updated_at: float
    running: str | None
    messages: list[str]
    turns: list[str]
    queue: list[str]


class ThreadStore:
    def __init__(
        self, client: redis.Redis, keys: Keys, ttl_s: int, indexes: SweepIndexes, listings: ListingStore | None = None
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.indexes = indexes
        self.listings = listings or ListingStore(client, keys, ttl_s, ttl_s, indexes.separate)
        self._create = client.register_script(_CREATE)
        self._submit = client.register_script(_SUBMIT)
        self._finish = client.register_script(_FINISH)

    def _thread_keys(self, thread_id: str) -> list[str]:
        k = self.keys
        return [k.thread(thread_id), k.thread_messages(thread_id), k.thread_turns(thread_id), k.thread_queue(thread_id)]

    def _listed(self, tenant: str) -> list[str]:
        """The listing key the scripts update themselves (single Redis), else none (see `_after`)."""
        return [] if self.indexes.separate else [self.listings.thread_key(tenant)]

    def _after(self, tenant: str, thread_id: str, now: float) -> None:
        """On a cluster the tenant's listing is in another slot: updated right after the thread's own script."""
        if self.indexes.separate:
            self.listings.list_thread(tenant, thread_id, now)

    def create(self, thread_id: str, agent: str, tenant: str, metadata: dict[str, Any], now: float) -> None:
        self._create(
            keys=[*self._thread_keys(thread_id), *self._listed(tenant)],
            args=[self.ttl_s, agent, tenant, json.dumps(metadata), now],
        )
        self._after(tenant, thread_id, now)

    def load(self, thread_id: str) -> StoredThread | None:
        keys = self._thread_keys(thread_id)
        pipe = self.client.pipeline(transaction=True)  # one snapshot: every transition is one script
        pipe.hgetall(keys[0])
        for key in keys[1:]:
            pipe.lrange(key, 0, -1)
        record, messages, turns, queue = pipe.execute()
        if not record:
            return None
        return StoredThread(
            thread_id=thread_id,
            agent=record["agent"],
            tenant=record["tenant"],
            metadata=json.loads(record.get("metadata") or "{}"),
            created_at=float(record["created_at"]),
            updated_at=float(record["updated_at"]),
            running=record.get("running") or None,
            messages=messages,
            turns=turns,
            queue=queue,
        )

    def running(self, thread_id: str) -> str | None:
        """The turn the thread runs now (None when idle or unknown)."""
        return str(self.client.hget(self.keys.thread(thread_id), "running") or "") or None

    def turn_states(self, turn_ids: list[str]) -> list[str | None]:
        """The stored state JSON of each turn (None once it expired), in one round trip."""
        if not turn_ids:
            return []
        return cast(list[str | None], self.client.mget([self.keys.turn(t) for t in turn_ids]))

    def submit(
        self,
        thread_id: str,
        turn_id: str,
        state_json: str,
        policy: str,
        messages: list[str],
        now: float,
        announce: Announcement,
        tenant: str = "",
        push: BrokerPush | None = None,
        listing: tuple[Script, list[str], list[Any]] | None = None,
    ) -> tuple[str, str | None]:
        """Store a turn of the thread under `policy`. Returns (outcome, the turn running before it):
        outcome is `started`, `queued`, `busy` (refused under `reject`) or `missing` (no such thread).
        A stored turn's `turn-start` (`announce`) is written by the script itself, and so is its first step's
        message (`push`, single Redis only) if the turn starts now; `listing` (the turn's listing write, checked
        against its version 0, single Redis only) goes in the same MULTI, taking only if the turn was stored."""
        k = self.keys
        separate = self.indexes.separate
        if separate and (push is not None or listing is not None):
            raise ValueError("a thread turn's message and listing go with its script on a single Redis only")
        absent = k.absent(turn_id)
        keys = [
            *self._thread_keys(thread_id),
            k.turn(turn_id),
            k.version(turn_id),
            k.messages(turn_id),
            k.thread_input(turn_id),
            absent if separate else self.indexes.key(ACTIVE, turn_id),
            absent,
            *(self._listed(tenant) or [absent]),
            k.thread_files(thread_id),
            k.seq(turn_id),
            k.events(turn_id),
            announce.channel,
            push.key if push is not None else absent,
        ]
        args: list[Any] = [
            policy,
            turn_id,
            state_json,
            now,
            self.ttl_s,
            announce.maxlen,
            announce.body,
            push.message if push else "",
        ]
        # on a cluster: on the sweeper's list before it may start (a submitter dying next leaves it findable); off
        # again if it waits behind the running turn or was refused, unless a finishing turn started it meanwhile
        # (that moved the entry's score; the sweeper also drops a waiting turn it finds there)
        added = separate and self.indexes.add(ACTIVE, turn_id, now, only_new=True)
        if listing is None:
            outcome, running = self._submit(keys=keys, args=[*args, *messages])
        else:
            pipe = self.client.pipeline(transaction=True)
            outcome, running = run_scripts(pipe, [(self._submit, keys, [*args, *messages]), listing])[0]
        if outcome != "started" and added:
            self.indexes.remove_if(ACTIVE, turn_id, now)
        if outcome in ("started", "queued"):
            self._after(tenant, thread_id, now)
        return outcome, running or None

    def finish(self, thread_id: str, turn_id: str, messages: list[str], now: float, tenant: str = "") -> str | None:
        """Fold the finished turn's transcript into the thread and start the next waiting turn: returns the
        turn to send (also on a repeated finish, until that turn moves on; a repeated send is fenced)."""
        k = self.keys
        head = str(self.client.lindex(k.thread_queue(thread_id), 0) or "")
        separate = self.indexes.separate
        for _ in range(100):  # another producer queued or a waiting turn left between the read and the script
            keys = [
                *self._thread_keys(thread_id),
                k.messages(head) if head else k.absent(turn_id),
                k.thread_input(head) if head else k.absent(turn_id),
                k.thread_input(turn_id),
                self.indexes.key(ACTIVE, head) if head and not separate else k.absent(turn_id),
                k.absent(turn_id),
                *self._listed(tenant),
            ]
            # on a cluster, the turn this may start goes on the sweeper's list first (see `submit`), with this
            # call's own score even when its submitter listed it: a late take-back by the submitter (which saw
            # it queued) then leaves it listed; off again only if this call added it and did not start it
            added = bool(head) and separate and self.indexes.add(ACTIVE, head, now)
            outcome, found = self._finish(keys=keys, args=[turn_id, head, self.ttl_s, now, *messages])
            if added and outcome != "start":
                self.indexes.remove_if(ACTIVE, head, now)
            if outcome != "moved":
                if outcome in ("idle", "start"):
                    self._after(tenant, thread_id, now)
                return str(found) if outcome in ("start", "again") else None
            head = str(found)
        raise RuntimeError(f"thread {thread_id}: its queue kept changing while turn {turn_id} finished")
