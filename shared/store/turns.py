"""Turn state: idempotent creation, compare-and-set commits, cancel flags, sweeper indexes.

Every commit is a Lua call on the turn's keys (one cluster slot) that checks the stored version and
writes the new state; a terminal commit puts a TTL on every key the turn owns. On a single Redis the same
call keeps the sweeper's sharded indexes in step with the status, so a list can never disagree with the
state it points at; on a Redis Cluster they live in other slots and are kept in step around the script
(see stepq.store.indexes): added to before a commit that enters them, removed from after one that leaves.

The transcript and the loop trace grow every step, so they are not part of the state
value: each is an append-only Redis list that a commit extends with what is new, and
each process keeps the parsed prefix it has seen. A step then costs the same at step
200 as at step 2 instead of re-parsing and re-writing the whole history.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from pydantic import TypeAdapter
from redis.commands.core import Script

from stepq.models import Message, StepOutput, StepTrace, TurnState, TurnStatus, carry_files
from stepq.store.broker_push import BrokerPush
from stepq.store.bulk import collection_paused
from stepq.store.events import Announcement
from stepq.store.indexes import ACTIVE, AWAITING, RUNNING, SweepIndexes, on_awaiting_list
from stepq.store.keys import Keys, home, idempotency_home
from stepq.store.listings import ListingStore
from stepq.store.pipelines import run_scripts

# KEYS: idempotency key (or KEYS[6]), turn, version, messages, sent-step, the turn's `absent` (names no key),
#       its `active` shard, the batch's counted turns, the batch record (each of the last three: or KEYS[6]), then,
#       when an event is announced, the turn's seq, events and channel, then, when the first step's message is
#       pushed, the broker queue's list and the turn's dispatched marker (or KEYS[6])
# ARGV: state json, turn id, ttl, index score, sent step ('0', or '-1' when the caller records the send),
#       #messages, messages..., then, to announce an event only if this stores the turn (its `turn-start`): the
#       event log's maxlen and the event's body (as the event publish script's), then the first step's broker
#       message, pushed only if this stores the turn (single Redis only: the broker's list is in no turn's slot)
# The idempotency key shares the turn's home, so one slot; on a cluster the shard and the batch's keys are in
# other slots, passed as KEYS[6] and updated around the script. A batch turn counts once in `created`, however
# often its submit is repeated (a submitter that died between storing a turn and counting it is counted later).
_CREATE = """
local function count(turn_id)
  if KEYS[8] == KEYS[6] then return end
  if redis.call('SADD', KEYS[8], turn_id) == 1 then redis.call('HINCRBY', KEYS[9], 'created', 1) end
  redis.call('EXPIRE', KEYS[8], ARGV[3])
  redis.call('EXPIRE', KEYS[9], ARGV[3])
end
if KEYS[1] ~= KEYS[6] then
  local existing = redis.call('GET', KEYS[1])
  if existing then
    count(existing)
    return existing
  end
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], '0')
redis.call('SET', KEYS[5], ARGV[5])
if KEYS[7] ~= KEYS[6] then redis.call('ZADD', KEYS[7], ARGV[4], ARGV[2]) end
count(ARGV[2])
local last = 6 + tonumber(ARGV[6])
for i = 7, last do redis.call('RPUSH', KEYS[4], ARGV[i]) end
if #ARGV > last then
  local seq = redis.call('INCR', KEYS[10])
  local payload = '{"seq":' .. seq .. ',' .. ARGV[last + 2]
  redis.call('XADD', KEYS[11], 'MAXLEN', '~', ARGV[last + 1], seq .. '-0', 'e', payload)
  redis.call('PUBLISH', KEYS[12], payload)
end
if #KEYS > 12 then
  redis.call('LPUSH', KEYS[13], ARGV[last + 3])
  if KEYS[14] ~= KEYS[6] then redis.call('SET', KEYS[14], '1', 'EX', ARGV[3]) end
end
return ''
"""

# KEYS: the batch's counted turns, the batch record; ARGV: turn id, ttl (a cluster's count, see _CREATE)
_COUNT = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then redis.call('HINCRBY', KEYS[2], 'created', 1) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# KEYS: turn, version, active shard, awaiting shard, messages, trace, lease, then the turn's other keys from
#       its events (8) and seq (9) on (expired when terminal), then, when an event is announced, the turn's
#       channel. On a cluster KEYS[3] and KEYS[4] are the turn's `absent` key and ARGV[5] is '': the shards live in
#       other slots and are updated around the script.
# ARGV: expected version, new json, turn id, status, index score ('' = none), ttl, lease token ('' = none),
#       release ('1'), #new messages, #new trace rows, new messages..., new trace..., then, to announce an event
#       only if the commit takes (a turn's `turn-finish`): the event log's maxlen, the event's body (as the
#       event publish script's) and the turn's `finished` channel to tell ('' = none; a channel is not a key)
_COMMIT = """
local current = redis.call('GET', KEYS[2])
if current ~= ARGV[1] then return 0 end
if ARGV[7] ~= '' and redis.call('GET', KEYS[7]) ~= ARGV[7] then return 0 end
local new_messages, new_trace = tonumber(ARGV[9]), tonumber(ARGV[10])
local last = 10 + new_messages + new_trace
local owned = #KEYS
if #ARGV > last then  -- the announced event, before the expiry below so the log keeps its TTL
  owned = #KEYS - 1
  local seq = redis.call('INCR', KEYS[9])
  local payload = '{"seq":' .. seq .. ',' .. ARGV[last + 2]
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[last + 1], seq .. '-0', 'e', payload)
  redis.call('PUBLISH', KEYS[#KEYS], payload)
  if ARGV[last + 3] ~= '' then redis.call('PUBLISH', ARGV[last + 3], seq) end  -- a turn-finish: its waiters
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], tonumber(ARGV[1]) + 1)
for i = 11, 10 + new_messages do redis.call('RPUSH', KEYS[5], ARGV[i]) end
for i = 11 + new_messages, last do redis.call('RPUSH', KEYS[6], ARGV[i]) end
if ARGV[8] == '1' then redis.call('DEL', KEYS[7], KEYS[11], KEYS[10]) end  -- lease, started, emitted
local status = ARGV[4]
local listed = ARGV[5] ~= ''
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  if listed then
    redis.call('ZREM', KEYS[3], ARGV[3])
    redis.call('ZREM', KEYS[4], ARGV[3])
  end
  for i = 1, owned do
    if i ~= 3 and i ~= 4 and i ~= 7 then redis.call('EXPIRE', KEYS[i], ARGV[6]) end
  end
elseif not listed then
  return 1
elseif status == 'awaiting_approval' or status == 'awaiting_tool_results' or status == 'awaiting_batch' then
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('ZADD', KEYS[4], ARGV[5], ARGV[3])
else
  redis.call('ZREM', KEYS[4], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[3])
end
return 1
"""


# KEYS: lease, started, emitted, cancel, checkpoint, turn, messages, trace, tenant policies' version (on a cluster,
#       in another slot: the turn's `absent` key, and the version is read next to the script)
# ARGV: token, lease ttl ms, step, messages already parsed here, trace steps already parsed here
_BEGIN = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0, redis.call('PTTL', KEYS[1])} end
redis.call('SET', KEYS[2], ARGV[3])
local out = {1, redis.call('GET', KEYS[3]), redis.call('EXISTS', KEYS[4]), redis.call('GET', KEYS[5]),
        redis.call('GET', KEYS[6]), redis.call('LRANGE', KEYS[7], ARGV[4], -1),
        redis.call('LRANGE', KEYS[8], ARGV[5], -1), redis.call('LLEN', KEYS[7]), redis.call('GET', KEYS[9])}
for i = 10, #KEYS do out[#out + 1] = redis.call('HMGET', KEYS[i], 'tokens', 'cost') end
return out
"""
# KEYS[10...], when given: the quota counters of the turn's tenant this process expects the step to check
# (store/quotas.py; on a single Redis only: on a cluster they live in the tenant's slot and are read apart), so
# the check before the model call costs no round trip of its own.

_SAVE = "redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return 1"

_MESSAGE = TypeAdapter(Message)


def index_score(state: TurnState) -> float:
    """The score of the turn's sweeper-list entry for its status: when the sweeper should look at it next
    (an active turn: its last commit; a parked one: its first approval expiry or its provider batch's deadline)."""
    if state.status.parked and state.parked:
        return state.parked.expires_at
    if state.status == TurnStatus.AWAITING_BATCH and state.batch_deadline_at:
        return state.batch_deadline_at
    return state.updated_at


@dataclass
class PreparedWrite:
    """A script call not sent yet (see EventLog.submit_script / StepEmitter.flush_with)."""

    script: Script
    keys: list[str]
    args: list[Any]
    state: TurnState | None = None
    expected_version: int = 0
    previous_status: TurnStatus | None = None  # as stored before the commit, with its list entry's score
    previous_score: float = 0.0
    written_status: TurnStatus | None = None  # what the commit stores, with its list entry's score
    written_score: float = 0.0
    # writes that ride in the same round trip right after this one (the listing update when the status changes)
    riders: list[tuple[Script, list[str], list[Any]]] = field(default_factory=list)


@dataclass
class StepStart:
    """What a delivery learns in its first round trip, once it holds the turn's lease."""

    state: TurnState | None
    emitted_step: int | None  # content of this step went out before a crash: subscribers need a reset
    cancel_requested: bool
    checkpoint: StepOutput | None
    policy_version: int = 0  # of the tenant policies (store/policies.py): a changed one is read again
    quota_usage: dict[str, Any] = field(default_factory=dict)  # counter key -> [tokens, cost] as read with the lease


@dataclass(frozen=True)
class LeaseHeld:
    """Another delivery holds the turn's lease; it lapses in `remaining_s` unless its holder renews it."""

    remaining_s: float


_HISTORY_FIELDS = {"messages": True, "trace": True}


@dataclass(frozen=True, slots=True)
class _History:
    messages: list[Message]
    trace: list[StepTrace]
    files: bool  # whether one of `messages` carries files


_NO_HISTORY = _History([], [], False)


class _HistoryCache:
    """Parsed transcript and trace prefixes by turn, for the turns this process touched recently, and whether
    the transcript carries files (scanned once per message, as it is appended).

    Safe because both lists are append-only in Redis: a cached prefix never goes stale.
    """

    def __init__(self, size: int = 1024) -> None:
        self._entries: OrderedDict[str, _History] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, turn_id: str) -> _History:
        with self._lock:
            entry = self._entries.get(turn_id)
            if entry is None:
                return _NO_HISTORY
            self._entries.move_to_end(turn_id)
            return entry

    def put(self, turn_id: str, messages: list[Message], trace: list[StepTrace]) -> bool:
        """Cache the turn's stored lists; returns whether its transcript carries files."""
        with self._lock:
            known = self._entries.get(turn_id, _NO_HISTORY)
            if len(known.messages) <= len(messages):  # appended to: only the new messages are looked at
                files = known.files or carry_files(messages[len(known.messages) :])
            else:  # started over (a re-used id)
                files = carry_files(messages)
            self._entries[turn_id] = _History(list(messages), list(trace), files)
            self._entries.move_to_end(turn_id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
            return files


class TurnStore:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        ttl_s: int,
        separate_indexes: bool = False,
        listings: ListingStore | None = None,
    ) -> None:
        """`separate_indexes` (on a Redis Cluster): the sweeper's lists (and the listings) are updated around the
        scripts."""
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.listings = listings or ListingStore(client, keys, ttl_s, ttl_s, separate_indexes)
        self._history = _HistoryCache()
        self.indexes = SweepIndexes(client, keys, separate_indexes)
        self._create = client.register_script(_CREATE)
        self._count = client.register_script(_COUNT)
        self._begin = client.register_script(_BEGIN)
        self._save = client.register_script(_SAVE)
        self._commit = client.register_script(_COMMIT)

    def create(
        self,
        state: TurnState,
        idempotency_key: str | None,
        batch_id: str | None = None,
        sent: bool = True,
        announce: Announcement | None = None,
        push: BrokerPush | None = None,
    ) -> str | None:
        """Store a new turn. Returns the existing turn id when the idempotency key was used before.
        `announce` (its `turn-start`, from `EventLog.announcement`) is written by the same script, only if it
        stores the turn: a submit costs no round trip for it, and a repeated key announces nothing.
        `push` (its first step's message, on a broker that is this Redis; needs `announce`) is pushed by the
        script too, only if it stores the turn, and marks the turn dispatched: no send, and no stored turn
        without its message.

        The turn is on the sweeper's `active` list from then on (on a cluster, put there first: a submitter
        dying right after storing it leaves a turn the sweeper finds). `sent=False`: step 0 counts as not sent
        until the caller's `mark_sent`, so the sweeper sends it if the caller dies first. A batch turn
        (`batch_id`) is counted in its batch's `created` counter once, however often its submit is repeated."""
        k = self.keys
        if idempotency_key and home(state.turn_id) != idempotency_home(state.agent, idempotency_key):
            raise ValueError(f"turn {state.turn_id} is not in the home of its idempotency key (see new_turn_state)")
        absent = k.absent(state.turn_id)
        idem = k.idempotency(state.agent, idempotency_key) if idempotency_key else absent
        messages = [_MESSAGE.dump_json(m).decode() for m in state.messages]
        separate = self.indexes.separate
        if separate:
            self.indexes.add(ACTIVE, state.turn_id, state.updated_at)
        in_script_batch = batch_id is not None and not separate
        create_keys = [
            idem,
            k.turn(state.turn_id),
            k.version(state.turn_id),
            k.messages(state.turn_id),
            k.sent_step(state.turn_id),
            absent,
            absent if separate else self.indexes.key(ACTIVE, state.turn_id),
            k.batch_created(batch_id) if in_script_batch and batch_id else absent,
            k.batch(batch_id) if in_script_batch and batch_id else absent,
        ]
        create_args: list[float | int | str | bytes] = [
            state.model_dump_json(exclude=_HISTORY_FIELDS),
            state.turn_id,
            self.ttl_s,
            state.updated_at,
            "0" if sent else "-1",
            len(messages),
            *messages,
        ]
        if announce is not None:
            create_keys += [k.seq(state.turn_id), k.events(state.turn_id), announce.channel]
            create_args += [announce.maxlen, announce.body]
        if push is not None:
            if announce is None or separate:
                raise ValueError("a turn's first message is pushed with its turn-start, on a single Redis only")
            create_keys += [push.key, k.dispatched(state.turn_id) if idempotency_key else absent]
            create_args.append(push.message)
        if separate:
            existing = self._create(keys=create_keys, args=create_args)
        else:  # single Redis: the turn and its listing in one MULTI (the listing only if this stored the turn)
            pipe = self.client.pipeline(transaction=True)
            existing = run_scripts(
                pipe, [(self._create, create_keys, create_args), self.listings.turn_write(state, 0)]
            )[0]
        if existing and separate:
            self.indexes.remove(ACTIVE, state.turn_id)  # the unused new id (the stored turn keeps its own entry)
        if not existing:
            self._stored(state)
            if separate:  # the listing's slot is the tenant's: its own call, after the turn exists
                self.listings.list_turn(state)
        if batch_id is not None and separate:
            self._count(
                keys=[k.batch_created(batch_id), k.batch(batch_id)], args=[existing or state.turn_id, self.ttl_s]
            )
        return existing or None

    def store_files(self, state: TurnState) -> None:
        """Store a new turn's files (base64), once each, before the turn itself. They expire after the turn TTL
        unless `files_stored` keeps them, so a submitter dying in between leaves nothing behind for good."""
        if not state._files:
            return
        key = self.keys.attachments(state.turn_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=state._files)  # type: ignore[arg-type]  # redis-py's Mapping is invariant
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def files_stored(self, state: TurnState, kept: bool) -> None:
        """The turn was created (`kept`: its files live as long as it does, expiring when it ends) or an
        idempotency key named an older turn (the new id is unused: its files go)."""
        if not state._files:
            return
        key = self.keys.attachments(state.turn_id)
        if kept:
            self.client.persist(key)
        else:
            self.client.delete(key)
        state._files = {}

    def load_file(self, turn_id: str, attachment_id: str, thread_id: str | None = None) -> str | None:
        """One stored file's bytes as base64: the turn's own, else its thread's (None once expired)."""
        found = self.client.hget(self.keys.attachments(turn_id), attachment_id)
        if found is None and thread_id is not None:
            found = self.client.hget(self.keys.thread_files(thread_id), attachment_id)
        return cast(str | None, found)

    def store_thread_files(self, thread_id: str, files: dict[str, str], ttl_s: int) -> list[str]:
        """Add a thread turn's files to the thread's (each once; the hash lives as long as the thread).
        Returns the ids this call added, for `drop_thread_files` when the turn is refused after all."""
        key = self.keys.thread_files(thread_id)
        pipe = self.client.pipeline(transaction=True)
        for file_id, data in files.items():
            pipe.hsetnx(key, file_id, data)
        pipe.expire(key, ttl_s)
        added = pipe.execute()[:-1]
        return [file_id for file_id, new in zip(files, added, strict=True) if new]

    def drop_thread_files(self, thread_id: str, file_ids: list[str]) -> None:
        if file_ids:
            self.client.hdel(self.keys.thread_files(thread_id), *file_ids)

    def renew_thread_files(self, thread_id: str, ttl_s: int) -> None:
        """The thread was used: its files live as long as its transcript."""
        self.client.expire(self.keys.thread_files(thread_id), ttl_s)

    def load(self, turn_id: str) -> TurnState | None:
        """The turn with its transcript and trace: one round trip, parsing only what this process has not seen."""
        k = self.keys
        cached = self._history.get(turn_id)
        messages, trace = cached.messages, cached.trace
        pipe = self.client.pipeline(transaction=True)  # one consistent snapshot: commits are atomic scripts
        pipe.get(k.turn(turn_id))
        pipe.lrange(k.messages(turn_id), len(messages), -1)
        pipe.lrange(k.trace(turn_id), len(trace), -1)
        pipe.llen(k.messages(turn_id))
        raw, new_messages, new_trace, total = pipe.execute()
        if not raw:
            return None
        if total < len(messages):  # the lists were rewritten (an expired and re-used id): start over
            self._history.put(turn_id, [], [])
            return self.load(turn_id)
        return self._assemble(turn_id, raw, messages, new_messages, trace, new_trace)

    def begin_step(
        self, turn_id: str, step: int, token: str, ttl_ms: int, quota_keys: list[str] | None = None
    ) -> StepStart | LeaseHeld:
        """Take the lease and read everything a step needs, in one round trip; LeaseHeld when another holds it.
        `quota_keys`: usage counters to read with it (not on a cluster, see _BEGIN)."""
        quota_keys = [] if self.indexes.separate else list(quota_keys or [])
        k = self.keys
        cached = self._history.get(turn_id)
        messages, trace = cached.messages, cached.trace
        reply = self._begin(
            keys=[
                k.lease(turn_id),
                k.started(turn_id),
                k.emitted(turn_id),
                k.cancel(turn_id),
                k.checkpoint(turn_id),
                k.turn(turn_id),
                k.messages(turn_id),
                k.trace(turn_id),
                k.absent(turn_id) if self.indexes.separate else k.policy_version,
                *quota_keys,
            ],
            args=[token, ttl_ms, step, len(messages), len(trace)],
        )
        if not reply[0]:
            return LeaseHeld(max(int(reply[1]), 0) / 1000)
        _, emitted, cancel, checkpoint, raw, new_messages, new_trace, total, policy_version = reply[:9]
        quota_usage = dict(zip(quota_keys, reply[9:], strict=True))
        if self.indexes.separate:  # a cluster: the version lives in the policies' slot
            policy_version = self.client.get(k.policy_version)
        state = None
        if raw:
            if total < len(messages):  # lists rewritten under a re-used id: read them whole
                self._history.put(turn_id, [], [])
                state = self.load(turn_id)
            else:
                state = self._assemble(turn_id, raw, messages, new_messages, trace, new_trace)
        saved = None
        if checkpoint:
            saved_step, _, body = str(checkpoint).partition("\x1f")
            saved = StepOutput.model_validate_json(body) if saved_step == str(step) else None
        version = int(policy_version) if policy_version else 0
        start = StepStart(state, int(emitted) if emitted is not None else None, bool(cancel), saved, version)
        start.quota_usage = quota_usage
        return start

    def _assemble(
        self,
        turn_id: str,
        raw: str,
        messages: list[Message],
        new_messages: list[str],
        trace: list[StepTrace],
        new_trace: list[str],
    ) -> TurnState:
        state = TurnState.model_validate_json(raw)
        with collection_paused(len(new_messages) + len(new_trace)):
            state.messages = [*messages, *(_MESSAGE.validate_json(m) for m in new_messages)]
            state.trace.steps = [*trace, *(StepTrace.model_validate_json(t) for t in new_trace)]
        self._stored(state)
        return state

    def mark_dispatched(self, turn_id: str) -> None:
        """Record that the turn's first step was sent, so a repeated submit does not send it again."""
        self.client.set(self.keys.dispatched(turn_id), "1", ex=self.ttl_s)

    def never_dispatched(self, turn_id: str) -> bool:
        """True for a turn whose submitter died between storing it and sending its first step: nothing was
        committed and no send was recorded. (A send that happened but went unrecorded is sent again;
        step fencing makes the duplicate harmless.)"""
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(self.keys.dispatched(turn_id))
        pipe.get(self.keys.version(turn_id))
        sent, version = pipe.execute()
        return not sent and version == "0"

    def _stored(self, state: TurnState) -> None:
        """Record that `state`'s transcript and trace are what Redis holds now."""
        state._stored_messages = len(state.messages)
        state._stored_trace = len(state.trace.steps)
        state._stored_status = state.status
        state._stored_score = index_score(state)
        state._stored_files = self._history.put(state.turn_id, state.messages, state.trace.steps)

    def commit(self, state: TurnState, lease_token: str | None = None, release: bool = False) -> bool:
        """Write `state` if nobody committed since it was loaded (and, given a lease token, only while that
        lease is still held); bumps `state.version` on success. `release` frees the lease in the same call."""
        prepared = self.prepare_commit(state, lease_token, release)
        if not prepared.riders:
            return self.finish_commit(prepared, prepared.script(keys=prepared.keys, args=prepared.args))
        pipe = self.client.pipeline(transaction=True)  # single Redis: the commit and its listing in one MULTI
        replies = run_scripts(pipe, [(prepared.script, prepared.keys, prepared.args), *prepared.riders])
        return self.finish_commit(prepared, replies[0])

    def prepare_commit(
        self,
        state: TurnState,
        lease_token: str | None = None,
        release: bool = False,
        announce: Announcement | None = None,
    ) -> PreparedWrite:
        """The commit as a script call, so a caller can send it in the same round trip as other writes;
        pass its reply to `finish_commit`. On a cluster, a commit that moves the turn onto a sweeper list puts
        it there now. `announce` (an event of the turn, from `EventLog.announcement`) is appended and
        published by the commit itself, only if it takes: a `turn-finish` costs no round trip of its own and
        never announces an end that was not stored."""
        k = self.keys
        expected = state.version
        state.version = expected + 1
        state.updated_at = time.time()
        score = index_score(state)
        if len(state.messages) < state._stored_messages or len(state.trace.steps) < state._stored_trace:
            state.version = expected
            raise ValueError("a turn's transcript and trace are append-only; stored entries cannot be removed")
        new_messages = [_MESSAGE.dump_json(m).decode() for m in state.messages[state._stored_messages :]]
        new_trace = [t.model_dump_json() for t in state.trace.steps[state._stored_trace :]]
        per_turn = k.per_turn(state.turn_id)
        if self.indexes.separate:
            if on_awaiting_list(state.status):
                self.indexes.add(AWAITING, state.turn_id, score)
            elif state.status in RUNNING and state._stored_status not in RUNNING:
                self.indexes.add(ACTIVE, state.turn_id, score)
            absent = k.absent(state.turn_id)
            lists = [absent, absent]
        else:
            lists = [self.indexes.key(ACTIVE, state.turn_id), self.indexes.key(AWAITING, state.turn_id)]
        keys = [per_turn[0], per_turn[1], *lists, per_turn[2], per_turn[3], k.lease(state.turn_id), *per_turn[4:]]
        args: list[Any] = [
            expected,
            state.model_dump_json(exclude=_HISTORY_FIELDS),
            state.turn_id,
            state.status.value,
            "" if self.indexes.separate else score,
            self.ttl_s,
            lease_token or "",
            "1" if release and lease_token else "0",
            len(new_messages),
            len(new_trace),
            *new_messages,
            *new_trace,
        ]
        if announce is not None:
            keys.append(announce.channel)
            args += [announce.maxlen, announce.body, announce.finished]
        prepared = PreparedWrite(
            self._commit, keys, args, state, expected, state._stored_status, state._stored_score, state.status, score
        )
        if state.status != state._stored_status and not self.indexes.separate:
            # the listing moves with the status, in the commit's round trip, applied only if the commit took
            prepared.riders.append(self.listings.turn_write(state, state.version))
        return prepared

    def finish_commit(self, prepared: PreparedWrite, reply: Any) -> bool:
        state = prepared.state
        assert state is not None
        if not reply:
            state.version = prepared.expected_version
            return False
        self._stored(state)
        if self.indexes.separate:
            self.indexes.after_commit(
                state.turn_id, state.status, prepared.previous_status, prepared.previous_score, state._stored_score
            )
            if state.status != prepared.previous_status:  # a cluster: the listing is in the tenant's slot
                self.listings.list_turn(state)
        return True

    def finish_riding_commit(self, prepared: PreparedWrite, reply: Any) -> bool:
        """`finish_commit` for a commit the step went on past (engine/context.py's riding commit; single Redis):
        it stored no transcript or trace rows, so what took is its status as written, not the state as it is now."""
        state = prepared.state
        assert state is not None and prepared.written_status is not None and not self.indexes.separate
        if not reply:
            state.version = prepared.expected_version
            return False
        state._stored_status, state._stored_score = prepared.written_status, prepared.written_score
        return True

    def checkpoint_write(self, turn_id: str, step: int, output_json: str) -> PreparedWrite:
        """Saving a step's model answer, as a script call that can share a round trip."""
        return PreparedWrite(self._save, [self.keys.checkpoint(turn_id)], self.checkpoint_args(step, output_json))

    def checkpoint_args(self, step: int, output_json: str) -> list[Any]:
        """The arguments of a checkpoint write (`checkpoint_write` with its JSON made later, if at all)."""
        return [f"{step}\x1f{output_json}", self.ttl_s]

    def save_checkpoint(self, turn_id: str, step: int, output_json: str) -> None:
        write = self.checkpoint_write(turn_id, step, output_json)
        write.script(keys=write.keys, args=write.args)

    def mark_sent(self, turn_id: str, step: int) -> None:
        """Record that a run_step message for `step` went to the broker. A turn committed at a later step
        than this, with no lease, lost its message: the worker died between the commit and the send."""
        self.client.set(self.keys.sent_step(turn_id), step, ex=self.ttl_s)

    def sent_step(self, turn_id: str) -> int | None:
        value = self.client.get(self.keys.sent_step(turn_id))
        return int(value) if value is not None else None

    def request_cancel(self, turn_id: str) -> None:
        self.client.set(self.keys.cancel(turn_id), "1", ex=self.ttl_s)

    def clear_emitted(self, turn_id: str) -> int | None:
        """Take the 'content emitted but not committed' marker; returns the step it named."""
        value = self.client.getdel(self.keys.emitted(turn_id))
        return int(value) if value is not None else None
