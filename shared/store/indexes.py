"""The sweeper's worklists, sharded: `active` (queued/running turns) and `awaiting` (parked turns).

Each list is `index_shards` keys, each in its own Redis Cluster slot, so the lists spread over the
cluster's masters like the turns do; a turn belongs to shard `crc32(turn_id) % index_shards`.

On a single Redis every script may touch any key, so the scripts that move a turn (create, commit, a thread
starting a turn, client-side results) update its list entries in the same atomic call: a list never
disagrees with the state it points at. On a Redis Cluster a turn's keys and its shard live in different
slots and no script can update both (`separate`): the lists are then kept in step around the script, in
separate calls ordered so that a crash in between leaves an entry too many (the sweeper drops it when it
finds the turn elsewhere), never one too few:

- before a commit that moves a turn into a list, the turn is added to it;
- after the commit succeeds, it is removed from the list it left, and its `active` score refreshed.

Other processes add entries concurrently (a decision or client-side results make a parked turn owed a
resume; a thread starts its next turn), so every removal that acts on what was read or written earlier is
conditional on the entry's score: it never undoes an add that happened in between (a late removal after a
commit that parked the turn keeps a decision's entry). A late refresh only moves an existing entry's score
(ZADD XX): it never puts back a turn that has left the list since.
"""

from __future__ import annotations

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
RUNNING = (TurnStatus.QUEUED, TurnStatus.RUNNING)  # the statuses the `active` list holds


def on_awaiting_list(status: TurnStatus | None) -> bool:
    """Statuses the `awaiting` list holds: parked for a person or a caller, or for a provider batch (its score
    the first expiry or the batch deadline, when the sweeper looks again)."""
    return status is not None and (status.parked or status == TurnStatus.AWAITING_BATCH)


class SweepIndexes:
    def __init__(self, client: redis.Redis, keys: Keys, separate: bool) -> None:
        self.client = client
        self.keys = keys
        # True on a Redis Cluster: the lists are updated around the scripts, not inside them
        self.separate = separate
        self._remove_if = client.register_script(_REMOVE_IF)

    def key(self, index: str, turn_id: str) -> str:
        shard = self.keys.shard(turn_id)
        return self.keys.active(shard) if index == ACTIVE else self.keys.awaiting(shard)

    def add(self, index: str, turn_id: str, score: float, only_new: bool = False, only_existing: bool = False) -> bool:
        """Put the turn on a list (or move its score); with `only_new`, only when it is not on it yet; with
        `only_existing`, only move the score of an entry that is there. True when this call added it."""
        key = self.key(index, turn_id)
        return bool(self.client.zadd(key, {turn_id: score}, nx=only_new, xx=only_existing))

    def add_many(self, index: str, turn_ids: list[str], score: float) -> None:
        """Put several turns on a list in one pipelined round trip (per node on a cluster)."""
        pipe = self.client.pipeline(transaction=False)
        for turn_id in turn_ids:
            pipe.zadd(self.key(index, turn_id), {turn_id: score})
        pipe.execute()

    def after_commit(
        self, turn_id: str, status: TurnStatus, previous: TurnStatus | None, previous_score: float, score: float
    ) -> None:
        """A commit from `previous` (its list entry scored `previous_score`) to `status` (scored `score`) succeeded
        (only with `separate`): take the turn off the list it left, unless someone re-added it meanwhile, and
        refresh an active turn's score (its last commit, which the sweeper's staleness check reads)."""
        active, awaiting = self.key(ACTIVE, turn_id), self.key(AWAITING, turn_id)
        if status.terminal:  # final: nothing re-adds a finished turn that counts
            pipe = self.client.pipeline(transaction=False)  # both shards share one slot: one node, one round trip
            pipe.zrem(active, turn_id)
            pipe.zrem(awaiting, turn_id)
            pipe.execute()
        elif status in RUNNING:
            self.client.zadd(active, {turn_id: score}, xx=True)
            if on_awaiting_list(previous):
                self.remove_if(AWAITING, turn_id, previous_score)
        elif on_awaiting_list(status) and previous in RUNNING:
            # a decision or client-side results may have listed it again since the commit: theirs stays
            self.remove_if(ACTIVE, turn_id, previous_score)

    def remove_if(self, index: str, turn_id: str, score: float) -> bool:
        """Drop the turn from a list if its score is still `score` (nobody re-added it since it was read)."""
        return bool(self._remove_if(keys=[self.key(index, turn_id)], args=[turn_id, repr(score)]))

    def remove(self, index: str, turn_id: str) -> None:
        self.client.zrem(self.key(index, turn_id), turn_id)

    def score(self, index: str, turn_id: str) -> float | None:
        found = self.client.zscore(self.key(index, turn_id), turn_id)
        return float(found) if found is not None else None

    def due(self, index: str, before: float, limit: int = 500) -> list[tuple[str, float]]:
        """(turn id, score) of the entries scored at or before `before`, at most `limit` per shard, read from
        every shard in one pipelined round trip (per node on a cluster)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.keys.index_shards):
            key = self.keys.active(shard) if index == ACTIVE else self.keys.awaiting(shard)
            pipe.zrangebyscore(key, "-inf", before, start=0, num=limit, withscores=True)
        return [(str(m), float(sc)) for rows in pipe.execute() for m, sc in cast(list[tuple[str, float]], rows)]

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
