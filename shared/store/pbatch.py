"""The provider-batch collector in Redis: parked step requests, the batches they went out in, their answers.

A step bound for a provider batch stores its built request under the turn (one at a time: a turn has one
step in flight) with its custom id `<turn>-<step>-<attempt>`, and joins its group's pending set. Each
write is idempotent on that custom id, so a step re-run after a crash queues nothing twice. The tick
takes a group's oldest requests into a batch record (one script: they leave the pending set exactly
when the record lists them), sends them, and later records each answer only while the turn still waits
for that very custom id (a step that gave up and ran online gets nothing late).

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import redis

from stepq.store.connection import get_many
from stepq.store.keys import Keys
from stepq.store.pipelines import queue_script

SEP = "\x1f"

# KEYS: request, pending, groups. ARGV: custom id, request JSON, score, group, ttl, turn id
_QUEUE = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '\\31' then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. '\\31' .. ARGV[2], 'EX', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[6])
redis.call('SADD', KEYS[3], ARGV[4])
return 1
"""

# A cluster's _QUEUE in two calls (the request is in its turn's slot, the queue in the provider batches' one):
# KEYS: request. ARGV: custom id, request JSON, ttl. Then _ENQUEUE (KEYS: pending, groups. ARGV: score, group,
# turn id) on the queue's slot.
_HOLD = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '\\31' then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. '\\31' .. ARGV[2], 'EX', ARGV[3])
return 1
"""
_ENQUEUE = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

# KEYS: pending, groups, batch, open. ARGV: count, group, local id, created, deadline, ttl
_TAKE = """
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #members == 0 then redis.call('SREM', KEYS[2], ARGV[2]) return {} end
redis.call('ZREM', KEYS[1], unpack(members))
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[2]) end
redis.call('HSET', KEYS[3], 'group', ARGV[2], 'state', 'submitting', 'members', table.concat(members, ','),
           'created_at', ARGV[4], 'deadline_at', ARGV[5])
redis.call('EXPIRE', KEYS[3], ARGV[6])
redis.call('SADD', KEYS[4], ARGV[3])
return members
"""

# KEYS: request, outcome. ARGV: custom id, outcome JSON, ttl
# An answer counts only while the turn still waits for this custom id; the request leaves with it.
_RECORD = """
local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. '\\31' then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS: request. ARGV: custom id. The step gives the request up (it runs online): a late answer is dropped.
_ABANDON = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '\\31' then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def custom_id(turn_id: str, step: int, attempt: int) -> str:
    """What a request is known by inside a provider batch (Anthropic allows ^[a-zA-Z0-9_-]{1,64}$)."""
    return f"{turn_id}-{step}-{attempt}"


def turn_of(custom: str) -> str:
    return custom.rsplit("-", 2)[0]


@dataclass(frozen=True)
class Queued:
    """A parked request as the tick reads it."""

    turn_id: str
    custom_id: str
    payload: dict[str, Any]  # {agent, provider, model, request}


class ProviderBatchStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int, cluster: bool = False) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.cluster = cluster  # a request and the queue are in different slots: queued in two calls
        self._queue = client.register_script(_QUEUE)
        self._hold = client.register_script(_HOLD)
        self._enqueue = client.register_script(_ENQUEUE)
        self._take = client.register_script(_TAKE)
        self._record = client.register_script(_RECORD)
        self._abandon = client.register_script(_ABANDON)

    # ------------------------------------------------------------------ the step's side

    def queue(self, turn_id: str, group: str, custom: str, payload: dict[str, Any], now: float) -> bool:
        """Park the request for the group's next batch; False when this custom id is already parked or sent."""
        k = self.keys
        request = json.dumps(payload, separators=(",", ":"))
        if self.cluster:  # the request first: a crash next leaves it to the batch deadline (the step runs online)
            if not self._hold(keys=[k.pbatch_request(turn_id)], args=[custom, request, self.ttl_s]):
                return False
            self._enqueue(keys=[k.pbatch_pending(group), k.pbatch_groups], args=[now, group, turn_id])
            return True
        args: list[Any] = [custom, request, now, group, self.ttl_s, turn_id]
        keys = [k.pbatch_request(turn_id), k.pbatch_pending(group), k.pbatch_groups]
        return bool(self._queue(keys=keys, args=args))

    def outcome(self, turn_id: str, custom: str) -> dict[str, Any] | None:
        """The batch's answer for this custom id, once recorded."""
        raw = cast(str | None, self.client.get(self.keys.pbatch_outcome(turn_id)))
        if raw is None:
            return None
        value = cast(dict[str, Any], json.loads(raw))
        return value if value.get("custom_id") == custom else None

    def abandon(self, turn_id: str, custom: str) -> None:
        self._abandon(keys=[self.keys.pbatch_request(turn_id)], args=[custom])

    def drop(self, turn_id: str) -> None:
        """The turn ended: whatever it had parked is not wanted any more."""
        self.client.delete(self.keys.pbatch_request(turn_id))

    # ------------------------------------------------------------------ the tick's side

    def groups(self) -> list[str]:
        return sorted(cast(set[str], self.client.smembers(self.keys.pbatch_groups)))

    def pending(self, group: str) -> tuple[int, float | None]:
        """How many requests wait in the group, and when the oldest one joined."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.pbatch_pending(group))
        pipe.zrange(self.keys.pbatch_pending(group), 0, 0, withscores=True)
        count, oldest = pipe.execute()
        return int(count), (float(oldest[0][1]) if oldest else None)

    def take(self, group: str, local_id: str, count: int, now: float, deadline_at: float) -> list[str]:
        """Move up to `count` of the group's oldest requests into batch `local_id` (state `submitting`)."""
        k = self.keys
        keys = [k.pbatch_pending(group), k.pbatch_groups, k.pbatch_batch(local_id), k.pbatch_open]
        args: list[Any] = [count, group, local_id, now, deadline_at, self.ttl_s]
        return [str(m) for m in cast(list[Any], self._take(keys=keys, args=args))]

    def requests(self, turn_ids: list[str]) -> list[Queued]:
        """The parked requests of these turns (a turn that ended or gave its request up is left out)."""
        if not turn_ids:
            return []
        raws = get_many(self.client, [self.keys.pbatch_request(t) for t in turn_ids])
        found = []
        for turn_id, raw in zip(turn_ids, raws, strict=True):
            if raw is not None:
                custom, _, body = raw.partition(SEP)
                found.append(Queued(turn_id, custom, cast(dict[str, Any], json.loads(body))))
        return found

    def open_batches(self) -> list[str]:
        return sorted(cast(set[str], self.client.smembers(self.keys.pbatch_open)))

    def batch(self, local_id: str) -> dict[str, str]:
        return cast(dict[str, str], self.client.hgetall(self.keys.pbatch_batch(local_id)))

    def update_batch(self, local_id: str, **fields: Any) -> None:
        self.client.hset(self.keys.pbatch_batch(local_id), mapping={k: str(v) for k, v in fields.items()})

    def record(self, turn_id: str, custom: str, outcome: dict[str, Any]) -> bool:
        """Store the answer for `custom` if the turn still waits for it; True when it was stored."""
        k = self.keys
        body = json.dumps({**outcome, "custom_id": custom}, separators=(",", ":"))
        return bool(self._record(keys=[k.pbatch_request(turn_id), k.pbatch_outcome(turn_id)],
                                 args=[custom, body, self.ttl_s]))  # fmt: skip

    def record_many(self, outcomes: list[tuple[str, str, dict[str, Any]]]) -> list[bool]:
        """`record` for many (turn id, custom id, outcome) in one round trip per 500: a batch's answers."""
        k, stored = self.keys, cast(list[bool], [])
        for start in range(0, len(outcomes), 500):
            pipe = self.client.pipeline(transaction=False)
            for turn_id, custom, outcome in outcomes[start : start + 500]:
                body = json.dumps({**outcome, "custom_id": custom}, separators=(",", ":"))
                queue_script(pipe, self._record, [k.pbatch_request(turn_id), k.pbatch_outcome(turn_id)],
                             [custom, body, self.ttl_s])  # fmt: skip
            stored.extend(bool(reply) for reply in pipe.execute())
        return stored

    def close(self, local_id: str, state: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.pbatch_batch(local_id), "state", state)
        pipe.srem(self.keys.pbatch_open, local_id)
        pipe.execute()
