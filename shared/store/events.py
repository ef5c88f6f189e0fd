"""The per-turn event log (a Redis stream whose entry ids are the event seq) plus live pub/sub.

Writing an event is one Lua call: allocate the next seq, XADD it under id `<seq>-0`,
PUBLISH it. Readers subscribe first, replay the log after their cursor, then follow
pub/sub, dropping seqs they have seen and re-reading the log when they see a gap.

Writes from concurrent threads (a worker streaming many steps) share round trips: a
group commit sends every write queued meanwhile in one pipeline. Each write still
blocks until it is in Redis and returns its own seq or raises its own error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from stepq import jsonsafe
from stepq.errors import EventCursorError, WaitTimeoutError
from stepq.models import CONTENT_EVENTS, Event, EventType
from stepq.store.keys import Keys
from stepq.store.pipelines import evalsha_batch, queue_evalsha, runs_again

# KEYS: seq, events, channel, emitted, finished. ARGV: maxlen, then per event: body, kind ('1' a content event,
# 'end' the turn's `turn-finish`, '0' any other), step. Several events of one turn go in one call (a step's
# flush); returns the last seq.
_PUBLISH = """
local seq
for i = 2, #ARGV, 3 do
  seq = redis.call('INCR', KEYS[1])
  local payload = '{"seq":' .. seq .. ',' .. ARGV[i]
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], seq .. '-0', 'e', payload)
  redis.call('PUBLISH', KEYS[3], payload)
  local kind = ARGV[i + 1]
  if kind == '1' then
    redis.call('SET', KEYS[4], ARGV[i + 2])
  elseif kind == 'end' then
    redis.call('PUBLISH', KEYS[5], seq)
  end
end
return seq
"""

TERMINAL = EventType.TURN_FINISH


def _body(turn_id: str, type_: EventType, step: int, data: dict[str, Any], now: float) -> bytes:
    """An event's envelope as the publish scripts take it: JSON without the opening brace (they prepend seq).
    One per streamed delta, so through `jsonsafe.dumps`; NaN/Infinity from a model or a tool come out as strings."""
    return jsonsafe.dumps({"turn_id": turn_id, "type": type_.value, "step": step, "data": data, "ts": now})[1:]


def _kind(type_: EventType) -> str:
    """The publish script's mark for an event: a content event records its step, `turn-finish` tells the
    turn's `finished` channel too."""
    return "1" if type_ in CONTENT_EVENTS else "end" if type_ == TERMINAL else "0"


_NAMED_TURNS = 4096  # turns whose publish keys are kept named (a worker streams at most a few hundred at once)
_LEAD_ROUNDS = 8  # batches one leader sends in a row before it hands the lead on


@dataclass(frozen=True, slots=True)
class Announcement:
    """One event for a commit to append and publish only if it takes (see TurnStore.prepare_commit)."""

    channel: str
    maxlen: int
    body: bytes  # the envelope's JSON without its opening brace: the script puts `{"seq":N,` in front
    finished: str = ""  # for a `turn-finish`: the turn's `Keys.finished` channel, told too


class PendingPublish:
    """One queued write: its Lua keys/args, then its result or error. `gate` is held until it is done
    (or until its thread is asked to lead the next batch)."""

    __slots__ = ("args", "done", "error", "gate", "keys", "lead", "result", "script", "waiting")

    def __init__(self, keys: list[str], args: list[Any], script: Script | None = None) -> None:
        self.keys = keys
        self.args = args
        self.script = script  # another script riding in the same round trip (None: the event write)
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.waiting = False
        self.lead = False
        self.gate = threading.Lock()
        self.gate.acquire()


class _GroupCommit:
    """Leader/followers: a thread that finds no batch in flight sends every queued write in one pipeline,
    then hands the lead to a waiting thread; the others sleep until their write is done. Alone, a write
    is one plain script call, exactly as without batching."""

    def __init__(self, client: redis.Redis, script: Script) -> None:
        self._client = client
        self._script = script
        self._lock = threading.Lock()
        self._queue: list[PendingPublish] = []
        self._busy = False  # a leader is sending a batch

    def submit(self, keys: list[str], args: list[Any], script: Script | None = None) -> PendingPublish:
        pending = PendingPublish(keys, args, script)
        with self._lock:
            self._queue.append(pending)
        return pending

    def wait(self, pending: PendingPublish) -> Any:
        with self._lock:
            lead = not pending.done and (pending.lead or not self._busy)
            if lead:
                self._busy = True
            elif not pending.done:
                pending.waiting = True
        if not lead and not pending.done:
            pending.gate.acquire()  # released when our write is done, or when we are to lead
            lead = not pending.done
        if lead:
            self._lead()
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _lead(self) -> None:
        """Send everything queued (our own write included) in one trip and wake its writers; while more
        writers wait, send their batch too (a few rounds at most: this thread has its own step to run),
        then pass the lead to one of them. Sending on costs no wake-up and no wait for the GIL."""
        for rounds_left in range(_LEAD_ROUNDS - 1, -1, -1):
            with self._lock:
                batch, self._queue = self._queue, []
            try:
                self._execute(batch)
            except BaseException as exc:  # e.g. KeyboardInterrupt: no writer may be left without an answer
                for p in batch:
                    if p.error is None and p.result is None:
                        p.error = exc
                rounds_left = 0
                raise
            finally:
                with self._lock:
                    for p in batch:
                        p.done = True
                        if p.waiting:
                            p.waiting = False
                            p.gate.release()
                    nxt = next((p for p in self._queue if p.waiting), None)
                    if nxt is None:
                        self._busy = False  # the next thread to wait leads
                    elif rounds_left == 0:
                        nxt.waiting, nxt.lead = False, True
                        nxt.gate.release()
            if nxt is None:
                return

    def _execute(self, batch: list[PendingPublish]) -> None:
        if len(batch) == 1:
            self._call(batch[0])
            return
        try:
            results = self._send(batch)
        except Exception as exc:  # the round trip itself failed (connection): so did every write in it
            for p in batch:
                p.error = exc
            return
        missed = False
        for p, result in zip(batch, results, strict=True):
            if runs_again(p.script or self._script, result, missed):
                missed = True
                self._call(p)  # the script cache was flushed: a plain call loads it again
            elif isinstance(result, Exception):
                p.error = result
            else:
                p.result = result

    def _send(self, batch: list[PendingPublish]) -> list[Any]:
        calls = [(p.script or self._script, p.keys, p.args) for p in batch]
        if not isinstance(self._client, RedisCluster):
            return evalsha_batch(self._client, calls)
        pipe = self._client.pipeline(transaction=False)
        for script, keys, args in calls:
            queue_evalsha(pipe, script, keys, args)
        return cast(list[Any], pipe.execute(raise_on_error=False))

    def _call(self, p: PendingPublish) -> None:
        try:
            p.result = (p.script or self._script)(keys=p.keys, args=p.args)
        except Exception as exc:
            p.error = exc


class EventLog:
    def __init__(self, client: redis.Redis, keys: Keys, maxlen: int) -> None:
        self.client = client
        self.keys = keys
        self.maxlen = maxlen
        self._publish = client.register_script(_PUBLISH)
        self._commits = _GroupCommit(client, self._publish)
        self._named: dict[str, tuple[str, str, str, str, str]] = {}

    def publish(self, turn_id: str, type_: EventType, step: int, data: dict[str, Any]) -> int:
        """Append one event and fan it out; returns its seq."""
        return self.wait(self.submit(turn_id, type_, step, data))

    def submit(self, turn_id: str, type_: EventType, step: int, data: dict[str, Any]) -> PendingPublish:
        """Queue one event (stamped now); `wait` writes it. Split so one thread can write several in one trip."""
        return self.submit_many(turn_id, [(type_, step, data)])

    def submit_many(self, turn_id: str, events: list[tuple[EventType, int, dict[str, Any]]]) -> PendingPublish:
        """Queue several events of one turn as one write (one script call); `wait` returns the last seq."""
        now = time.time()
        args: list[Any] = [self.maxlen]
        for type_, step, data in events:
            args += [_body(turn_id, type_, step, data, now), _kind(type_), step]
        return self._commits.submit(self._publish_keys(turn_id), args)

    def announcement(self, turn_id: str, type_: EventType, step: int, data: dict[str, Any]) -> Announcement:
        """An event (stamped now, not a content event) for a commit to write if it takes."""
        assert type_ not in CONTENT_EVENTS, "a commit's announcement does not mark the step's content as streamed"
        body = _body(turn_id, type_, step, data, time.time())
        finished = self.keys.finished(turn_id) if type_ == TERMINAL else ""
        return Announcement(self.keys.channel(turn_id), self.maxlen, body, finished)

    def _publish_keys(self, turn_id: str) -> list[str]:
        """The publish script's five keys of a turn, named once per turn (a streamed step asks per delta)."""
        named = self._named.get(turn_id)
        if named is None:
            k = self.keys
            named = (k.seq(turn_id), k.events(turn_id), k.channel(turn_id), k.emitted(turn_id), k.finished(turn_id))
            if len(self._named) >= _NAMED_TURNS:
                self._named.clear()  # turns come and go: a bounded memo, refilled by the next delta
            self._named[turn_id] = named
        return list(named)

    def wait(self, pending: PendingPublish) -> int:
        """Block until a submitted event is written; returns its seq (or raises its error)."""
        return int(self._commits.wait(pending))

    def submit_script(self, script: Script, keys: list[str], args: list[Any]) -> PendingPublish:
        """Queue another write (a state commit, a checkpoint) to share the round trip of queued events."""
        return self._commits.submit(keys, args, script)

    def wait_script(self, pending: PendingPublish) -> Any:
        """Block until a `submit_script` write is done; returns the script's reply (or raises its error)."""
        return self._commits.wait(pending)

    def read(self, turn_id: str, after: int = 0, until: int | None = None, count: int = 1000) -> list[Event]:
        """Events with seq in (after, until], oldest first."""
        end = f"{until}-0" if until is not None else "+"
        entries = cast(
            list[tuple[str, dict[str, str]]],
            self.client.xrange(self.keys.events(turn_id), f"{after + 1}-0", end, count=count),
        )
        return [Event.model_validate_json(fields["e"]) for _, fields in entries]

    def last_seq(self, turn_id: str) -> int:
        value = self.client.get(self.keys.seq(turn_id))
        return int(value) if value else 0

    def check_cursor(self, turn_id: str, after: object) -> int:
        """`after` as a seq cursor of this turn: an integer from 0 to the last seq, else EventCursorError."""
        if isinstance(after, bool) or not isinstance(after, int):
            raise EventCursorError(f"after={after!r}: the events cursor must be an integer seq (0 = from the start)")
        if after < 0:
            raise EventCursorError(f"after={after}: the events cursor must not be negative (0 = from the start)")
        last = self.last_seq(turn_id)
        if after > last:
            raise EventCursorError(f"after={after} is past the end of turn {turn_id}'s events (last seq {last})")
        return after

    def follow(
        self,
        turn_id: str,
        after: int = 0,
        idle_timeout: float | None = None,
        stop_at_finish: bool = True,
        is_finished: Callable[[], bool] | None = None,
    ) -> Iterator[Event]:
        """Every event after `after`, once each, in seq order; live until the turn finishes.

        `idle_timeout` bounds the wait for the next event (WaitTimeoutError when it passes). A bad cursor
        raises EventCursorError here, before anything is subscribed.
        """
        after = self.check_cursor(turn_id, after)
        return self._follow(turn_id, after, idle_timeout, stop_at_finish, is_finished)

    def _follow(
        self,
        turn_id: str,
        after: int,
        idle_timeout: float | None,
        stop_at_finish: bool,
        is_finished: Callable[[], bool] | None,
    ) -> Iterator[Event]:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.keys.channel(turn_id))
        try:
            cursor = after
            while True:  # replay in pages until the log is drained
                page = self.read(turn_id, cursor)
                for event in page:
                    yield event
                    cursor = event.seq
                    if stop_at_finish and event.type == TERMINAL:
                        return
                if len(page) < 1000:
                    break
            deadline = None if idle_timeout is None else time.monotonic() + idle_timeout
            ended_quietly = False  # the last quiet tick saw the turn ended and nothing new in its log
            while True:
                wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                message = pubsub.get_message(timeout=min(wait, 1.0))
                if message is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise WaitTimeoutError(f"no event on turn {turn_id} for {idle_timeout}s")
                    # a quiet channel: check the log too, in case a publish raced our subscribe. Whether the
                    # turn finished is asked first: what was written before it finished is then in this read
                    # (asked after the read, a turn ending in between would lose its last events)
                    finished = is_finished is not None and is_finished()
                    missed = self.read(turn_id, cursor)
                    if not missed and finished:
                        if ended_quietly:  # still nothing a whole quiet tick later
                            return  # ended without a turn-finish event (its writer died after the commit)
                        ended_quietly = True  # its turn-finish goes out just after the commit: give it a tick
                        continue
                    ended_quietly = False
                else:
                    event = Event.model_validate_json(message["data"])
                    if event.seq <= cursor:
                        continue
                    missed = self.read(turn_id, cursor, event.seq - 1) if event.seq > cursor + 1 else []
                    missed.append(event)
                for event in missed:
                    if event.seq <= cursor:
                        continue
                    yield event
                    cursor = event.seq
                    if deadline is not None:
                        deadline = time.monotonic() + (idle_timeout or 0)
                    if stop_at_finish and event.type == TERMINAL:
                        return
        finally:
            pubsub.close()
