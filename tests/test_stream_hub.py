"""The gateway's stream hub on real Redis: bursts of events reach every stream once, in order, through the
hub's buffered-reply fast path, and its envelope parsing agrees with a full JSON decode."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from stepq.fleet.runtime import Runtime
from stepq.models import EventType
from stepq.producer.gateway.streams import EventReader, RawEvent, StreamHub, follow_batches
from tests.conftest import REDIS_URL

BURST = 400
TIMEOUT = 60.0


@contextlib.asynccontextmanager
async def _hub() -> AsyncIterator[tuple[StreamHub, aioredis.Redis]]:
    """A started hub on a connection of its own, and a client for the readers' commands; all closed after."""
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True, max_connections=1)
    commands = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    hub = StreamHub(client)
    await hub.start()
    try:
        yield hub, commands
    finally:
        await hub.close()
        await client.aclose()
        await commands.aclose()


async def _collect(hub: StreamHub, reader: EventReader, turn_id: str, into: list[int]) -> None:
    async for batch in follow_batches(hub, reader, turn_id, 0, keepalive_s=30.0):
        into += [e.seq for e in batch]


def _publish_burst(rt: Runtime, turn_id: str, count: int) -> None:
    """`count` deltas then the finish, each its own script call, all in one pipelined round trip: Redis sends
    the PUBLISHes back to back, so the hub's socket reads carry many messages at once."""
    pending = [rt.events.submit(turn_id, EventType.TEXT_DELTA, 1, {"text": f"d{i}"}) for i in range(count)]
    pending.append(rt.events.submit(turn_id, EventType.TURN_FINISH, 1, {"finish_reason": "stop"}))
    for p in pending:
        rt.events.wait(p)


async def _run_bursts(rt: Runtime, turns: list[str], streams_per_turn: int) -> tuple[list[list[int]], int]:
    async with _hub() as (hub, commands):
        reader = EventReader(commands, rt.keys)
        seen: list[list[int]] = [[] for _ in range(len(turns) * streams_per_turn)]
        tasks = [
            asyncio.create_task(_collect(hub, reader, turns[i // streams_per_turn], seen[i])) for i in range(len(seen))
        ]
        channels = [rt.keys.channel(t) for t in turns]
        async with asyncio.timeout(TIMEOUT):  # every channel subscribed at the server before the burst (else
            while any(n < 1 for _, n in await commands.pubsub_numsub(*channels)):  # the burst comes from the log)
                await asyncio.sleep(0.01)
        for t in turns:  # on the loop's thread, blocking it: the hub reads only once the bursts are all sent,
            _publish_burst(rt, t, BURST)  # so its socket holds many messages, whatever the scheduler does
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(*tasks)
        return seen, hub.drained


def test_bursts_reach_every_stream_once_in_order_through_the_fast_path(rt: Runtime, prefix: str) -> None:
    """Three turns, two streams each, 400 events a turn published back to back: every stream gets seqs
    1..401 exactly once, in order; and messages were dispatched from the parser's buffer (the fast path is
    live with the installed redis-py and hiredis: a redis-py upgrade that disables it fails here). The bursts
    are published while the hub's event loop is blocked, so they wait in its socket together: a busy machine
    cannot turn them into one read per message."""
    turns = [f"{prefix}-hub-{i}" for i in range(3)]
    seen, drained = asyncio.run(_run_bursts(rt, turns, streams_per_turn=2))
    for seqs in seen:
        assert seqs == list(range(1, BURST + 2))
    assert drained > 0


async def _subscribe_during_a_burst(rt: Runtime, prefix: str) -> list[int]:
    """A stream opened while another channel's burst is being drained: its subscribe confirmation arrives
    among buffered messages and must still be handled (via redis-py), or its `listen()` never returns."""
    async with _hub() as (hub, commands):
        reader = EventReader(commands, rt.keys)
        busy, late = f"{prefix}-busy", f"{prefix}-late"
        first: list[int] = []
        second: list[int] = []
        task = asyncio.create_task(_collect(hub, reader, busy, first))
        async with asyncio.timeout(TIMEOUT):
            while hub.subscribed_channels < 1:
                await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        burst = loop.run_in_executor(None, _publish_burst, rt, busy, BURST * 5)
        async with asyncio.timeout(TIMEOUT):
            while not first:  # the burst is arriving
                await asyncio.sleep(0)
        later = asyncio.create_task(_collect(hub, reader, late, second))
        await burst
        await loop.run_in_executor(None, _publish_burst, rt, late, 3)
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(task, later)
        assert first == list(range(1, BURST * 5 + 2))
        return second


def test_a_stream_opened_during_a_burst_is_confirmed_and_complete(rt: Runtime, prefix: str) -> None:
    assert asyncio.run(_subscribe_during_a_burst(rt, prefix)) == [1, 2, 3, 4]


def test_envelope_fast_parse_agrees_with_json(rt: Runtime, prefix: str) -> None:
    """What our writer stores parses the same by the fast path and by a full decode; anything else falls
    back to the full decode (and a payload that is not an event is still refused)."""
    turn_id = f"{prefix}-parse"
    rt.events.publish(turn_id, EventType.TEXT_DELTA, 1, {"text": 'a "quoted" ,"type":"x" \\ line\nbreak'})
    rt.events.publish(turn_id, EventType.TOOL_CALL, 2, {"name": "t", "arguments": {"type": "nested"}})
    stored = [fields["e"] for _, fields in rt.redis.xrange(rt.keys.events(turn_id))]
    assert len(stored) == 2
    for payload in stored:
        head = json.loads(payload)
        assert RawEvent.parse(payload) == RawEvent(head["seq"], head["type"], payload)
    other = json.dumps({"type": "text-delta", "seq": 7, "data": {}}, indent=1)  # keys reordered, newlines
    parsed = RawEvent.parse(other)
    assert (parsed.seq, parsed.type, "\n" in parsed.payload) == (7, "text-delta", False)
    escaped = '{"seq":3,"turn_id":"t","type":"te\\u0078t","ts":1}'
    assert RawEvent.parse(escaped) == RawEvent(3, "text", escaped)
    for bad in ('{"seq":"x","type":"a"}', "not json", '{"type":"a"}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            RawEvent.parse(bad)


class CountingReader(EventReader):
    """The real reader, counting the log reads the streams make."""

    reads = 0

    async def read(self, turn_id: str, after: int, until: int | None = None) -> list[RawEvent]:
        self.reads += 1
        return await super().read(turn_id, after, until)


async def _open_and_follow(rt: Runtime, prefix: str, streams: int) -> tuple[list[list[int]], int]:
    async with _hub() as (hub, commands):
        reader = CountingReader(commands, rt.keys)
        turns = [f"{prefix}-open-{i}" for i in range(streams)]
        seen: list[list[int]] = [[] for _ in turns]
        tasks = [asyncio.create_task(_collect(hub, reader, t, into)) for t, into in zip(turns, seen, strict=True)]
        async with asyncio.timeout(TIMEOUT):
            while hub.subscribed_channels < streams or reader.reads < streams:
                await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, _publish_burst, rt, t, 3) for t in turns))
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(*tasks)
        return seen, reader.reads


def test_opening_a_stream_reads_the_log_once(rt: Runtime, prefix: str) -> None:
    """Subscribe, then one read of the log, then live messages only: the subscription's confirmation is not
    taken for a reconnect (that re-read every stream's log a second time as it opened)."""
    seen, reads = asyncio.run(_open_and_follow(rt, prefix, streams=20))
    assert seen == [[1, 2, 3, 4]] * 20
    assert reads == 20


class EndingReader(EventReader):
    """Says the turn ended, after writing its last event first: the moment a follow's quiet check can fall
    into (the turn ending between the follow's last read of the log and its question)."""

    def __init__(self, client: aioredis.Redis, rt: Runtime, turn_id: str) -> None:
        super().__init__(client, rt.keys)
        self.rt, self.turn_id, self.late = rt, turn_id, 0

    async def finished(self, turn_id: str) -> bool:
        if not self.late:
            self.late = self.rt.events.publish(self.turn_id, EventType.TEXT_DELTA, 1, {"text": "the last words"})
        return True


async def _follow_one_quiet_turn(
    rt: Runtime, turn_id: str, reader_class: Callable[[aioredis.Redis, Runtime, str], EventReader]
) -> tuple[list[RawEvent], Any]:
    """Follow a turn with one event written, through a hub and `reader_class` (it decides how the turn ends)
    until the stream closes; returns what the stream sent and the reader."""
    rt.events.publish(turn_id, EventType.TEXT_DELTA, 1, {"text": "the first words"})
    async with _hub() as (hub, commands):
        reader = reader_class(commands, rt, turn_id)
        sent: list[RawEvent] = []
        async with asyncio.timeout(TIMEOUT):
            async for batch in follow_batches(hub, reader, turn_id, 0, keepalive_s=0.2):
                sent += batch
        return sent, reader


def test_a_quiet_stream_keeps_the_last_event_of_a_turn_that_ends_as_it_checks(rt: Runtime, prefix: str) -> None:
    """A quiet stream asks whether the turn ended, then reads the log: an event written in between is sent
    before the stream closes (asked the other way round, it was lost)."""
    sent, reader = asyncio.run(_follow_one_quiet_turn(rt, f"{prefix}-ending", EndingReader))
    assert reader.late == 2
    assert [e.seq for e in sent] == [1, 2]


class LateFinishReader(EventReader):
    """Says the turn ended from the first quiet tick on, and writes its turn-finish only at the second: the
    commit is stored one round trip before that event."""

    def __init__(self, client: aioredis.Redis, rt: Runtime, turn_id: str) -> None:
        super().__init__(client, rt.keys)
        self.rt, self.turn_id, self.asked = rt, turn_id, 0

    async def finished(self, turn_id: str) -> bool:
        self.asked += 1
        if self.asked == 2:
            self.rt.events.publish(self.turn_id, EventType.TURN_FINISH, 1, {"status": "completed"})
        return True


def test_a_quiet_stream_waits_a_tick_for_the_turn_finish_that_follows_the_commit(rt: Runtime, prefix: str) -> None:
    """A quiet stream that finds the turn ended and nothing new keeps listening one more keep-alive: its
    turn-finish is written just after the commit, and closing on the first tick lost it."""
    sent, _ = asyncio.run(_follow_one_quiet_turn(rt, f"{prefix}-late-finish", LateFinishReader))
    assert [e.type for e in sent] == ["text-delta", "turn-finish"]
