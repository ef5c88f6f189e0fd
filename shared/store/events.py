"""The per-turn event log (a Redis stream whose entry ids are the event seq) plus live pub/sub.

Writing an event is one Lua call: allocate the next seq, XADD it under id `<seq>-0`,
PUBLISH it. Readers subscribe first, replay the log after their cursor, then follow
pub/sub, dropping seqs they have seen and re-reading the log when they see a gap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import redis

from shared.models import CONTENT_EVENTS, Event, EventType
from shared.store.keys import Keys

_PUBLISH = """
local seq = redis.call('INCR', KEYS[1])
local payload = '{"seq":' .. seq .. ',' .. ARGV[1]
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], seq .. '-0', 'e', payload)
redis.call('PUBLISH', KEYS[3], payload)
if ARGV[3] == '1' then redis.call('SET', KEYS[4], ARGV[4]) end
return seq
"""

TERMINAL = EventType.TURN_FINISH


class EventLog:
    def __init__(self, client: redis.Redis, keys: Keys, maxlen: int) -> None:
        self.client = client
        self.keys = keys
        self.maxlen = maxlen
        self._publish = client.register_script(_PUBLISH)

    def publish(self, turn_id: str, type_: EventType, step: int, data: dict[str, Any]) -> int:
        """Append one event and fan it out; returns its seq."""
        body = json.dumps(
            {"turn_id": turn_id, "type": type_.value, "step": step, "data": data, "ts": time.time()},
            separators=(",", ":"),
        )[1:]
        k = self.keys
        seq = self._publish(
            keys=[k.seq(turn_id), k.events(turn_id), k.channel(turn_id), k.emitted(turn_id)],
            args=[body, self.maxlen, "1" if type_ in CONTENT_EVENTS else "0", step],
        )
        return int(seq)

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

    def follow(
        self,
        turn_id: str,
        after: int = 0,
        idle_timeout: float | None = None,
        stop_at_finish: bool = True,
        is_finished: Callable[[], bool] | None = None,
    ) -> Iterator[Event]:
        """Every event after `after`, once each, in seq order; live until the turn finishes.

        `idle_timeout` bounds the wait for the next event (TimeoutError when it passes).
        """
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
            while True:
                wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                message = pubsub.get_message(timeout=min(wait, 1.0))
                if message is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(f"no event on turn {turn_id} for {idle_timeout}s")
                    # a quiet channel: check the log too, in case a publish raced our subscribe
                    missed = self.read(turn_id, cursor)
                    if not missed and is_finished is not None and is_finished():
                        return  # ended without a turn-finish event (its writer died after the commit)
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
