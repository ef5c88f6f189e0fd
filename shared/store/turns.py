"""Turn state: idempotent creation, compare-and-set commits, cancel flags, sweeper indexes.

Every commit is a Lua call that checks the stored version, writes the new state
and keeps the sweeper's indexes (`active`, `awaiting`) in step with the status,
so an index can never disagree with the state it points at. A terminal commit
puts a TTL on every key the turn owns.
"""

from __future__ import annotations

import time
from typing import cast

import redis

from shared.models import TurnState, TurnStatus
from shared.providers.base import StepOutput
from shared.store.keys import Keys

_CREATE = """
if KEYS[1] ~= '' then
  local existing = redis.call('GET', KEYS[1])
  if existing then return existing end
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[4])
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], '0')
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
if KEYS[5] ~= '' then
  redis.call('HINCRBY', KEYS[5], 'created', 1)
  redis.call('EXPIRE', KEYS[5], ARGV[4])
end
return ''
"""

# KEYS: turn, version, active, awaiting, then the turn's other keys (expired when terminal)
# ARGV: expected version, new json, turn id, status, score, ttl
_COMMIT = """
local current = redis.call('GET', KEYS[2])
if current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], tonumber(ARGV[1]) + 1)
local status = ARGV[4]
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
  for i = 1, #KEYS do
    if i ~= 3 and i ~= 4 then redis.call('EXPIRE', KEYS[i], ARGV[6]) end
  end
elseif status == 'awaiting_approval' then
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('ZADD', KEYS[4], ARGV[5], ARGV[3])
else
  redis.call('ZREM', KEYS[4], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[3])
end
return 1
"""


class TurnStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._create = client.register_script(_CREATE)
        self._commit = client.register_script(_COMMIT)

    def create(self, state: TurnState, idempotency_key: str | None, counter_key: str | None = None) -> str | None:
        """Store a new turn. Returns the existing turn id when the idempotency key was used before.

        `counter_key` (a batch's record) gets its `created` count bumped in the same atomic step,
        so the count is exact even when the submitter dies right after creating the turn."""
        k = self.keys
        idem = k.idempotency(state.agent, idempotency_key) if idempotency_key else ""
        existing = self._create(
            keys=[idem, k.turn(state.turn_id), k.version(state.turn_id), k.active, counter_key or ""],
            args=[state.model_dump_json(), state.turn_id, state.updated_at, self.ttl_s],
        )
        return existing or None

    def load(self, turn_id: str) -> TurnState | None:
        raw = self.client.get(self.keys.turn(turn_id))
        return TurnState.model_validate_json(raw) if raw else None

    def reload(self, state: TurnState) -> TurnState | None:
        """The stored state now: `state` itself if nothing was committed since it was read, else a fresh load.

        One small GET and no parse on the common path: create and commit write the state and its
        version key together (atomically), so an unchanged version means an unchanged state.
        """
        if self.client.get(self.keys.version(state.turn_id)) == str(state.version):
            return state
        return self.load(state.turn_id)

    def commit(self, state: TurnState) -> bool:
        """Write `state` if nobody committed since it was loaded; bumps `state.version` on success."""
        k = self.keys
        expected = state.version
        state.version = expected + 1
        state.updated_at = time.time()
        score = state.updated_at
        if state.status == TurnStatus.AWAITING_APPROVAL and state.parked:
            score = min(a.expires_at for a in state.parked.approvals)
        per_turn = k.per_turn(state.turn_id)
        ok = self._commit(
            keys=[per_turn[0], per_turn[1], k.active, k.awaiting, *per_turn[2:]],
            args=[expected, state.model_dump_json(), state.turn_id, state.status.value, score, self.ttl_s],
        )
        if not ok:
            state.version = expected
        return bool(ok)

    def save_checkpoint(self, turn_id: str, step: int, output_json: str) -> None:
        self.client.set(self.keys.checkpoint(turn_id), f"{step}\x1f{output_json}", ex=self.ttl_s)

    def load_checkpoint(self, turn_id: str, step: int) -> StepOutput | None:
        """The checkpointed model answer for `step`, if that step crashed after the model answered."""
        raw = self.client.get(self.keys.checkpoint(turn_id))
        if not raw:
            return None
        saved_step, _, body = str(raw).partition("\x1f")
        return StepOutput.model_validate_json(body) if saved_step == str(step) else None

    def request_cancel(self, turn_id: str) -> None:
        self.client.set(self.keys.cancel(turn_id), "1", ex=self.ttl_s)

    def cancel_requested(self, turn_id: str) -> bool:
        return bool(self.client.exists(self.keys.cancel(turn_id)))

    def stale_active(self, older_than: float, limit: int = 500) -> list[str]:
        return cast(list[str], self.client.zrangebyscore(self.keys.active, "-inf", older_than, start=0, num=limit))

    def expired_awaiting(self, now: float, limit: int = 500) -> list[str]:
        return cast(list[str], self.client.zrangebyscore(self.keys.awaiting, "-inf", now, start=0, num=limit))

    def clear_emitted(self, turn_id: str) -> int | None:
        """Take the 'content emitted but not committed' marker; returns the step it named."""
        value = self.client.getdel(self.keys.emitted(turn_id))
        return int(value) if value is not None else None

    def step_flags(self, turn_id: str) -> tuple[int | None, bool]:
        """`clear_emitted` and `cancel_requested` in one round trip, for the start of a step."""
        pipe = self.client.pipeline(transaction=False)
        pipe.getdel(self.keys.emitted(turn_id))
        pipe.exists(self.keys.cancel(turn_id))
        emitted, cancel = pipe.execute()
        return (int(emitted) if emitted is not None else None), bool(cancel)
