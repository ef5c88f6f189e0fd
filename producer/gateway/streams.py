"""Following many turns' events over a fixed number of Redis connections.

`StreamHub` holds ONE pub/sub connection for the whole process and multiplexes it over every open
stream: a channel is subscribed once however many clients follow it, and each message is parsed
once and handed to every listener of its channel. `follow()` is the per-stream algorithm the
library's `EventLog.follow` uses, made async: subscribe (and wait for Redis to confirm), replay
the log after the cursor, then follow live messages, dropping seqs already sent and re-reading
the log on a gap, an overflow or a reconnect. A quiet stream re-checks the log and the turn's
status at every keep-alive tick, so a turn whose finish event was lost still ends its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from stepq.models import EventType, TurnStatus
from stepq.store.keys import Keys

try:  # the sentinel redis-py's hiredis parser makes `gets()` return when no complete reply is buffered
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # another redis-py layout: the hub reads one message at a time
    _NOT_ENOUGH_DATA = None

log = logging.getLogger("stepq.gateway")

FINISH = EventType.TURN_FINISH.value
_PAGE = 1000
_MAX_BUFFERED = 2000  # a listener this far behind drops its buffer and re-reads the log instead


@dataclass(frozen=True, slots=True)
class RawEvent:
    """An event as stored: its JSON text (sent to clients verbatim) plus the two fields routing needs."""

    seq: int
    type: str
    payload: str

    @classmethod
    def parse(cls, payload: str) -> RawEvent:
        fast = _parse_envelope(payload)
        if fast is not None:
            return fast
        head = json.loads(payload)
        if "\n" in payload:  # never from our writer; an SSE data line must not contain one
            payload = json.dumps(head, separators=(",", ":"))
        return cls(int(head["seq"]), str(head["type"]), payload)


_SEQ = '{"seq":'
_TYPE = ',"type":"'


def _parse_envelope(payload: str) -> RawEvent | None:
    """seq and type read off the front of the envelope our writer builds (`{"seq":N,"turn_id":"…","type":"…",`,
    compact JSON, no newline) without decoding the rest: at thousands of events a second, decoding every event's
    data only to route it was the hub's largest single cost. Anything else (None) takes the full JSON decode."""
    if not payload.startswith(_SEQ) or "\n" in payload:
        return None
    comma = payload.find(",", 7)
    digits = payload[7:comma]
    start = payload.find(_TYPE, comma) + len(_TYPE)
    end = payload.find('"', start)
    kind = payload[start:end]
    if comma < 0 or not digits.isdigit() or start < len(_TYPE) or end < 0 or "\\" in kind:
        return None
    # the string before "type" is turn_id's value; JSON escapes quotes in strings, so the first `,"type":"` is the key
    return RawEvent(int(digits), kind, payload)


@dataclass(eq=False)
class Listener:
    """One open stream's inbox on a channel."""

    buffer: deque[RawEvent] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    resync: bool = False  # messages may have been missed: re-read the log
    quiet: bool = False  # nothing arrived for a keep-alive interval: send a keep-alive and re-check the log
    last: float = field(default_factory=time.monotonic)  # when something last arrived (or a keep-alive went)

    def push(self, event: RawEvent) -> None:
        if len(self.buffer) >= _MAX_BUFFERED:
            self.buffer.clear()
            self.resync = True
        else:
            self.buffer.append(event)
        self.last = time.monotonic()
        self.wake.set()

    def lost(self) -> None:
        self.resync = True
        self.wake.set()


class _KeepAlive:
    """One timer per stream for its whole life, flagging `quiet` when nothing arrived for `seconds`. (A
    timeout around every wait instead armed and cancelled a timer per event: at 10,000 events a second
    that was an eighth of the gateway's CPU.) The timer re-arms itself for when the stream would next be
    quiet, so a busy stream costs one timer callback per `seconds`, not one per event."""

    def __init__(self, listener: Listener, seconds: float) -> None:
        self.listener = listener
        self.seconds = seconds
        self.loop = asyncio.get_running_loop()
        self.handle = self.loop.call_later(seconds, self.tick)

    def tick(self) -> None:
        listener = self.listener
        now = time.monotonic()
        due = listener.last + self.seconds
        if now >= due:
            listener.quiet = True
            listener.last = now
            listener.wake.set()
            due = now + self.seconds
        self.handle = self.loop.call_later(due - now, self.tick)

    def cancel(self) -> None:
        self.handle.cancel()


class StreamHub:
    """One pub/sub connection shared by every stream of this process."""

    def __init__(self, pubsub_client: aioredis.Redis) -> None:
        self._client = pubsub_client
        self._pubsub = pubsub_client.pubsub()
        self._listeners: dict[str, set[Listener]] = {}
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._send = asyncio.Lock()  # SUBSCRIBE/UNSUBSCRIBE writes; only the reader task reads
        self._active = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.drained = 0  # messages dispatched straight from the parser's buffer (see _drain)

    @property
    def subscribed_channels(self) -> int:
        return len(self._listeners)

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_forever(), name="stepq-stream-hub")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(RedisError, RuntimeError):
            await self._pubsub.aclose()

    @contextlib.asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[Listener]:
        """A listener on `channel`, yielded once Redis has confirmed the subscription."""
        listener = Listener()
        listeners = self._listeners.setdefault(channel, set())
        listeners.add(listener)
        try:
            confirmed = self._confirmed.get(channel)
            if confirmed is None:
                confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
                async with self._send:
                    await self._pubsub.subscribe(channel)
                self._active.set()
            await asyncio.shield(confirmed)
            yield listener
        finally:
            listeners.discard(listener)
            if not listeners and self._listeners.get(channel) is listeners:
                del self._listeners[channel]
                self._confirmed.pop(channel, None)
                # shielded: a client hanging up (cancelling this stream) must not leave the channel subscribed
                with contextlib.suppress(RedisError, RuntimeError, ConnectionError, asyncio.CancelledError):
                    await asyncio.shield(self._unsubscribe(channel))

    async def _unsubscribe(self, channel: str) -> None:
        async with self._send:
            if channel not in self._listeners:  # nobody subscribed it again while we waited for the lock
                await self._pubsub.unsubscribe(channel)

    async def _read_forever(self) -> None:
        backoff = 0.1
        while True:
            if not self._pubsub.subscribed:
                self._active.clear()
                await self._active.wait()
                continue
            try:
                message = await self._pubsub.get_message(timeout=None)  # blocks; no timer per message
                backoff = 0.1
                if message is not None:
                    self._dispatch(message)
                await self._drain()
            except (RedisError, ConnectionError, OSError) as exc:
                log.warning("stream hub lost its Redis pub/sub connection (%s); reconnecting", exc)
                for listeners in list(self._listeners.values()):
                    for listener in listeners:
                        listener.lost()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _drain(self) -> None:
        """Dispatch every reply already read off the socket and parsed, without a round through redis-py's
        per-message path (a timeout scope, push-notification hooks, a dict per message: most of the hub's
        cost at thousands of messages a second). Only the C parser's complete replies are taken, nothing
        is read from the socket here; subscribe confirmations and anything unexpected still go through
        `PubSub.handle_message` so redis-py's own bookkeeping stays right. A connection without the hiredis
        parser (fakeredis, another redis-py layout) is simply not drained: get_message does it all."""
        reader = _buffered_replies(self._pubsub)
        if reader is None:
            return
        while True:
            raw = reader.gets()
            if raw is _NOT_ENOUGH_DATA or raw is False:
                return
            # a list (hiredis >= 3.2 hands pub/sub messages over as its PushNotification, a list subclass)
            if isinstance(raw, list) and len(raw) == 3 and raw[0] == "message":
                self.drained += 1
                self._deliver(raw[1], raw[2])
                continue
            if isinstance(raw, Exception):
                raise raw if isinstance(raw, RedisError | ConnectionError) else RedisError(str(raw))
            message = await self._pubsub.handle_message(raw)
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        channel = message["channel"]
        kind = message["type"]
        if kind == "subscribe":
            future = self._confirmed.get(channel)
            if future is not None and not future.done():
                # the first confirmation: every listener of the channel is still waiting for it in listen()
                # and reads the log once it returns, so nothing can be missed (a re-read here doubled the
                # Redis reads of every stream's start: 2,000 extra XRANGEs when 2,000 clients connect)
                future.set_result(None)
                return
            for listener in self._listeners.get(channel, ()):
                listener.lost()  # a re-subscription after a reconnect: anything may have been missed
            return
        if kind == "message":
            self._deliver(channel, message["data"])

    def _deliver(self, channel: str, data: str) -> None:
        listeners = self._listeners.get(channel)
        if not listeners:
            return
        try:
            event = RawEvent.parse(data)
        except (ValueError, KeyError, TypeError):
            log.warning("dropped a malformed message on %s", channel)
            return
        for listener in listeners:
            listener.push(event)


def _buffered_replies(pubsub: Any) -> Any | None:
    """The hiredis reader behind a redis-py pub/sub connection (its `gets()` returns the next complete reply
    already received), or None when the connection is not one redis-py built with hiredis."""
    parser = getattr(getattr(pubsub, "connection", None), "_parser", None)
    reader = getattr(parser, "_reader", None)
    if _NOT_ENOUGH_DATA is None or type(reader).__module__ != "hiredis" or not callable(getattr(reader, "gets", None)):
        return None
    return reader


class EventReader:
    """Reads a turn's event log and status over the shared async pool."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def read(self, turn_id: str, after: int, until: int | None = None) -> list[RawEvent]:
        """Every logged event with seq in (after, until], oldest first (all pages)."""
        found: list[RawEvent] = []
        cursor = after
        end = f"{until}-0" if until is not None else "+"
        while True:
            entries = cast(
                list[tuple[str, dict[str, str]]],
                await self.client.xrange(self.keys.events(turn_id), f"{cursor + 1}-0", end, count=_PAGE),
            )
            found += [RawEvent.parse(fields["e"]) for _, fields in entries]
            if len(entries) < _PAGE:
                return found
            cursor = found[-1].seq

    async def owner_and_last_seq(self, turn_id: str) -> tuple[str | None, int]:
        """The turn's tenant (None: no such turn) and its last event seq, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.turn(turn_id))
        pipe.get(self.keys.seq(turn_id))
        raw, seq = await pipe.execute()
        if not raw:
            return None, 0
        tenant = json.loads(raw).get("metadata", {}).get("tenant")
        return (tenant if isinstance(tenant, str) else ""), int(seq or 0)

    async def last_seq(self, turn_id: str) -> int:
        value = await self.client.get(self.keys.seq(turn_id))
        return int(value) if value else 0

    async def finished(self, turn_id: str) -> bool:
        """True when the turn ended (or expired): a quiet stream with nothing left to read may close."""
        raw = await self.client.get(self.keys.turn(turn_id))
        if not raw:
            return True
        return TurnStatus(json.loads(raw)["status"]).terminal


T = TypeVar("T")


async def _patiently(what: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Redis going away (a restart, a failover, a pool exhausted under load) is waited out, not died of:
    an open stream retries with backoff and carries on from its cursor."""
    delay = 0.1
    while True:
        try:
            return await what(*args)
        except (RedisError, OSError) as exc:
            log.warning("stream read failed (%s); retrying in %.1fs", type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def follow(
    hub: StreamHub, reader: EventReader, turn_id: str, after: int, keepalive_s: float
) -> AsyncIterator[RawEvent | None]:
    """Every event after `after`, once each, in seq order, until `turn-finish`; None is a keep-alive tick."""
    async for batch in follow_batches(hub, reader, turn_id, after, keepalive_s):
        if not batch:
            yield None
        for event in batch:
            yield event


async def follow_batches(
    hub: StreamHub, reader: EventReader, turn_id: str, after: int, keepalive_s: float
) -> AsyncIterator[list[RawEvent]]:
    """Every event after `after`, once each, in seq order, until `turn-finish`.

    Yields batches: whatever arrived since the last one (a client that falls behind gets bigger
    batches, so the cost per event drops exactly when it matters); an empty batch is a keep-alive tick.
    """
    cursor = after
    async with hub.listen(reader.keys.channel(turn_id)) as listener:
        timer = _KeepAlive(listener, keepalive_s)
        try:
            pending = await _patiently(reader.read, turn_id, cursor)
            ended_quietly = False  # the last quiet tick saw the turn ended and nothing new in its log
            while True:
                batch: list[RawEvent] = []
                for event in pending:
                    if event.seq <= cursor:
                        continue
                    if event.seq > cursor + 1:  # a gap: what was published before it is in the log
                        missed = await _patiently(reader.read, turn_id, cursor, event.seq - 1)
                        for old in missed:
                            if old.seq > cursor:
                                cursor = old.seq
                                batch.append(old)
                        if event.seq <= cursor:
                            continue
                    cursor = event.seq
                    batch.append(event)
                finish = next((i for i, e in enumerate(batch) if e.type == FINISH), None)
                if finish is not None:
                    yield batch[: finish + 1]
                    return
                if batch:
                    yield batch
                if not listener.buffer and not listener.resync and not listener.quiet:
                    await listener.wake.wait()  # no timer per wait: _keep_alive flags a quiet stream
                listener.wake.clear()
                quiet, listener.quiet = listener.quiet, False
                pending = list(listener.buffer)
                listener.buffer.clear()
                if listener.resync or quiet:
                    listener.resync = False
                    # whether the turn ended is asked before the log is read: what it wrote before it ended is
                    # then in this read (asked after it, a turn ending in between would lose its last events)
                    ended = quiet and await _patiently(reader.finished, turn_id)
                    pending = await _patiently(reader.read, turn_id, cursor) + pending
                    if ended and not pending:
                        if ended_quietly:  # still nothing a whole keep-alive later
                            return  # ended without a turn-finish event (its writer died after the commit)
                        ended_quietly = True  # its turn-finish goes out just after the commit: give it a tick
                if pending:
                    ended_quietly = False
                if quiet:
                    yield []
        finally:
            timer.cancel()
