"""The sweeper's worklists, sharded: `active` (queued/running turns) and `awaiting` (parked turns).

Each list is `index_shards` keys, each in its own Redis Cluster slot, so the lists spread over the
cluster's masters like the turns do; a turn belongs to shard `crc32(turn_id) % index_shards`. A turn's
keys and its shard live in different slots, so no script can update both: a commit keeps them in step in
separate calls, ordered so that a crash in between leaves an entry too many (the sweeper drops it when it
finds the turn elsewhere), never one too few:

- before a commit that moves a turn into a list, the turn is added to it;
- after the commit succeeds, it is removed from the list it left (and its `active` score refreshed).

Removals that act on what was read earlier (the sweeper, a thread turn that ended up waiting) are
conditional on the entry's score, so they never undo an add that happened in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import redis

from stepq.models import TurnStatus
from stepq.store.keys import Keys

# KEYS: one index shard; ARGV: member, the score it had when read
_REMOVE_IF = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
"""

ACTIVE = "active"
AWAITING = "awaiting"


def on_awaiting_list(status: TurnStatus | None) -> bool:
    """Statuses the `awaiting` list holds: parked for a person or a caller, or for a provider batch (its score
    the first expiry or the batch deadline, when the sweeper looks again)."""
    return status is not None and (status.parked or status == TurnStatus.AWAITING_BATCH)


class SweepIndexes:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._remove_if = client.register_script(_REMOVE_IF)

    def key(self, index: str, turn_id: str) -> str:
        shard = self.keys.shard(turn_id)
        return self.keys.active(shard) if index == ACTIVE else self.keys.awaiting(shard)

    def add(self, index: str, turn_id: str, score: float, only_new: bool = False, only_existing: bool = False) -> bool:
        """Put the turn on a list (or move its score); with `only_new`, only when it is not on it yet; with
        `only_existing`, only move the score of an entry that is there. True when this call added it."""
        key = self.key(index, turn_id)
        return bool(self.client.zadd(key, {turn_id: score}, nx=only_new, xx=only_existing))

    def after_commit(self, turn_id: str, status: TurnStatus, was_parked: bool, score: float) -> None:
        """A commit to `status` succeeded: take the turn off the list it left; refresh an active turn's score
        (the time of its last commit, which the sweeper's staleness check reads)."""
        active, awaiting = self.key(ACTIVE, turn_id), self.key(AWAITING, turn_id)
        pipe = self.client.pipeline(transaction=False)  # both shards share one slot: one node, one round trip
        if status in (TurnStatus.QUEUED, TurnStatus.RUNNING):
            pipe.zadd(active, {turn_id: score})
            if was_parked:
                pipe.zrem(awaiting, turn_id)
        elif on_awaiting_list(status):
            pipe.zrem(active, turn_id)
        else:
            pipe.zrem(active, turn_id)
            pipe.zrem(awaiting, turn_id)
        pipe.execute()

    def remove_if(self, index: str, turn_id: str, score: float) -> bool:
        """Drop the turn from a list if its score is still `score` (nobody re-added it since it was read)."""
        return bool(self._remove_if(keys=[self.key(index, turn_id)], args=[turn_id, repr(score)]))

    def remove(self, index: str, turn_id: str) -> None:
        self.client.zrem(self.key(index, turn_id), turn_id)

    def score(self, index: str, turn_id: str) -> float | None:
        found = self.client.zscore(self.key(index, turn_id), turn_id)
        return float(found) if found is not None else None

    def due(self, index: str, before: float, limit: int = 500) -> Iterator[tuple[str, float]]:
        """(turn id, score) of the entries scored at or before `before`, shard by shard (at most `limit` each)."""
        for shard in range(self.keys.index_shards):
            key = self.keys.active(shard) if index == ACTIVE else self.keys.awaiting(shard)
            found = self.client.zrangebyscore(key, "-inf", before, start=0, num=limit, withscores=True)
            yield from cast(list[tuple[str, float]], found)

    def count(self, index: str) -> int:
        """How many turns the list holds, over every shard (one pipelined round trip per node)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.keys.index_shards):
            pipe.zcard(self.keys.active(shard) if index == ACTIVE else self.keys.awaiting(shard))
        return sum(int(n) for n in pipe.execute())

    def first(self, index: str, limit: int, newest: bool) -> list[tuple[str, float]]:
        """The `limit` entries with the highest (`newest`) or lowest scores over every shard."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.keys.index_shards):
            key = self.keys.active(shard) if index == ACTIVE else self.keys.awaiting(shard)
            if newest:
                pipe.zrevrange(key, 0, limit - 1, withscores=True)
            else:
                pipe.zrange(key, 0, limit - 1, withscores=True)
        merged = [(str(m), float(s)) for rows in pipe.execute() for m, s in rows]
        return sorted(merged, key=lambda row: row[1], reverse=newest)[:limit]
