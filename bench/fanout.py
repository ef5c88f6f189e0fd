"""Text-delta fan-out: coalesced (StepEmitter with a flush window) vs one publish per delta.

A producer thread streams the same text (default 20,000 deltas of 4 chars, unpaced) through
`stepq.engine.emitter.StepEmitter` into a turn's event log; 1 or 10 subscriber processes read it
with the real reader, `EventLog.follow`. For each run it reports delivered text chars/s and
events/s (summed over subscribers, first emit to last receive), publish->receive latency (the
event's `ts`, stamped when the event is written) and emit->receive latency per delta (includes
time spent waiting in the coalescing buffer). Every subscriber's text is checked byte for byte.

Target: coalesced delivered text chars/s >= 5x the one-publish-per-delta rate.

    .venv/bin/python -m bench.fanout --deltas 20000 --window-ms 10 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench._common import (
    DEFAULT_REDIS_URL,
    bench_settings,
    cleanup,
    median,
    percentile,
    positive_count,
    table,
    unique_prefix,
)
from stepq.engine.emitter import StepEmitter
from stepq.fleet.runtime import get_runtime
from stepq.models import Delta, EventType
from stepq.store.events import EventLog

TARGET_RATIO = 5.0
CHUNK = 4


def chunk(i: int) -> str:
    return format(i % 0x10000, "04x")  # 4 chars, deterministic: a subscriber's text can be checked exactly


def expected_digest(deltas: int) -> str:
    return hashlib.sha1("".join(chunk(i) for i in range(deltas)).encode()).hexdigest()


# ---------------------------------------------------------------------------- subscriber processes


def subscriber_main(redis_url: str, prefix: str, index: int, jobs: Any, results: Any) -> None:
    """One subscriber process: for each turn id it is given, follow the turn to its end."""
    from stepq.store.connection import get_redis
    from stepq.store.keys import Keys

    settings = bench_settings(redis_url, prefix)
    log = EventLog(get_redis(settings), Keys(prefix), settings.event_maxlen)
    while (turn_id := jobs.get()) is not None:
        try:
            events = log.follow(turn_id, idle_timeout=120)
            next(events)  # turn-start, replayed from the log: we are subscribed before the stream starts
            results.put(("ready", index))
            received: list[tuple[float, float, int]] = []  # (receive time, event ts, chars)
            parts: list[str] = []
            for event in events:
                now = time.time()
                if event.type == EventType.TEXT_DELTA:
                    text = event.data["text"]
                    received.append((now, event.ts, len(text)))
                    parts.append(text)
            digest = hashlib.sha1("".join(parts).encode()).hexdigest()
            results.put(("done", index, received, digest))
        except Exception as exc:  # report, don't hang the benchmark
            results.put(("error", index, f"{type(exc).__name__}: {exc}"))


class Subscribers:
    """A pool of subscriber processes, started once and reused for every run."""

    def __init__(self, count: int, redis_url: str, prefix: str) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(count)]
        self.procs = [
            ctx.Process(target=subscriber_main, args=(redis_url, prefix, i, self.jobs[i], self.results), daemon=True)
            for i in range(count)
        ]
        for p in self.procs:
            p.start()

    def follow(self, turn_id: str, count: int) -> None:
        for q in self.jobs[:count]:
            q.put(turn_id)
        self._collect("ready", count)

    def collect(self, count: int) -> list[tuple[list[tuple[float, float, int]], str]]:
        return [(msg[2], msg[3]) for msg in self._collect("done", count)]

    def _collect(self, kind: str, count: int) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        while len(got) < count:
            msg = self.results.get(timeout=300)
            if msg[0] == "error":
                raise RuntimeError(f"subscriber {msg[1]} failed: {msg[2]}")
            if msg[0] != kind:
                raise RuntimeError(f"subscriber {msg[1]} sent {msg[0]!r}, expected {kind!r}")
            got.append(msg)
        return got

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


# ---------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    subscribers: int
    window_ms: float
    events: int  # text-delta events per subscriber
    elapsed_s: float
    chars_per_s: float
    events_per_s: float
    publish_p50_ms: float
    publish_p99_ms: float
    emit_p50_ms: float
    emit_p99_ms: float


def produce(log: EventLog, turn_id: str, window_s: float, deltas: int, rate: float, emit_times: list[float]) -> None:
    """The producer thread: stream the deltas through a StepEmitter, then end the turn."""
    emitter = StepEmitter(log, turn_id, 0, window_s)
    start = time.perf_counter()
    for i in range(deltas):
        if rate > 0:
            due = start + i / rate
            while (lag := due - time.perf_counter()) > 0:
                time.sleep(min(lag, 0.001))  # pacing the producer (benchmark only)
        emit_times[i] = time.time()
        emitter.emit(Delta("text", chunk(i)))
    emitter.flush()
    emitter.publish(EventType.TURN_FINISH, {"status": "completed"})


def run_once(
    log: EventLog, subs: Subscribers, count: int, window_ms: float, deltas: int, rate: float, digest: str
) -> RunResult:
    turn_id = f"turn_{uuid.uuid4().hex}"
    log.publish(turn_id, EventType.TURN_START, 0, {"agent": "bench.fanout"})
    subs.follow(turn_id, count)
    emit_times = [0.0] * deltas
    producer = threading.Thread(
        target=produce, args=(log, turn_id, window_ms / 1000, deltas, rate, emit_times), name="bench-producer"
    )
    producer.start()
    producer.join()
    results = subs.collect(count)

    publish_lat: list[float] = []
    emit_lat: list[float] = []
    last_receive = 0.0
    events = 0
    for received, got_digest in results:
        if got_digest != digest:
            raise RuntimeError("a subscriber received text that differs from what was streamed")
        events += len(received)
        offset = 0  # chars delivered so far: delta i is in the event whose range covers chars 4i..4i+3
        for recv, ts, chars in received:
            publish_lat.append(recv - ts)
            first, end = offset // CHUNK, (offset + chars) // CHUNK
            emit_lat += [recv - emit_times[i] for i in range(first, end)]
            offset += chars
            last_receive = max(last_receive, recv)
    elapsed = last_receive - emit_times[0]
    total_chars = deltas * CHUNK * count
    return RunResult(
        subscribers=count,
        window_ms=window_ms,
        events=events // count,
        elapsed_s=elapsed,
        chars_per_s=total_chars / elapsed,
        events_per_s=events / elapsed,
        publish_p50_ms=percentile(publish_lat, 50) * 1000,
        publish_p99_ms=percentile(publish_lat, 99) * 1000,
        emit_p50_ms=percentile(emit_lat, 50) * 1000,
        emit_p99_ms=percentile(emit_lat, 99) * 1000,
    )


# ---------------------------------------------------------------------------- report


def summarize(runs: list[RunResult]) -> RunResult:
    """The median run by chars/s (its latencies come with it, so one row is one real run)."""
    ordered = sorted(runs, key=lambda r: r.chars_per_s)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--deltas", type=positive_count, default=20_000, help="text deltas of 4 chars per run (default 20000)"
    )
    parser.add_argument("--window-ms", type=float, default=10.0, help="coalescing window (default 10 ms)")
    parser.add_argument("--rate", type=float, default=0.0, help="producer deltas/s; 0 = as fast as it can (default)")
    parser.add_argument(
        "--subscribers", type=positive_count, nargs="+", default=[1, 10], help="subscriber counts (default 1 10)"
    )
    parser.add_argument("--repeat", type=positive_count, default=3, help="runs per configuration; the median is shown")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args(argv)

    prefix = unique_prefix("fan")
    settings = bench_settings(args.redis_url, prefix)
    log = get_runtime(settings).events
    digest = expected_digest(args.deltas)
    rate = "unpaced" if args.rate <= 0 else f"{args.rate:.0f} deltas/s"
    print(
        f"run {prefix}: {args.deltas} deltas x {CHUNK} chars, producer {rate}, "
        f"coalesced window {args.window_ms:g} ms vs 0 ms, subscribers {args.subscribers}, repeat {args.repeat}",
        flush=True,
    )
    subs = Subscribers(max(args.subscribers), args.redis_url, prefix)
    rows: list[list[str]] = []
    ratios: list[tuple[int, float, float]] = []
    try:
        for count in args.subscribers:
            got: dict[float, list[RunResult]] = {0.0: [], args.window_ms: []}
            for _ in range(args.repeat):
                for window in (0.0, args.window_ms):  # interleaved, so drift hits both alike
                    got[window].append(run_once(log, subs, count, window, args.deltas, args.rate, digest))
            naive, coalesced = summarize(got[0.0]), summarize(got[args.window_ms])
            for label, r in (("per delta", naive), ("coalesced", coalesced)):
                rows.append(
                    [
                        str(count),
                        label,
                        f"{r.window_ms:g}",
                        str(r.events),
                        f"{r.elapsed_s:.3f}",
                        f"{r.events_per_s:,.0f}",
                        f"{r.chars_per_s:,.0f}",
                        f"{r.publish_p50_ms:.2f} / {r.publish_p99_ms:.2f}",
                        f"{r.emit_p50_ms:.2f} / {r.emit_p99_ms:.2f}",
                    ]
                )
            speedup = median([r.chars_per_s for r in got[args.window_ms]]) / median([r.chars_per_s for r in got[0.0]])
            ratios.append((count, speedup, naive.events / max(coalesced.events, 1)))
            print(f"{count} subscriber(s): coalesced / per-delta = {speedup:.1f}x delivered text", flush=True)
    finally:
        subs.close()
        print(f"cleaned up {cleanup(args.redis_url, prefix)} keys under {prefix}")
    print()
    headers = [
        "subs",
        "mode",
        "window ms",
        "events/sub",
        "elapsed s",
        "delivered events/s",
        "delivered chars/s",
        "publish->recv p50/p99 ms",
        "emit->recv p50/p99 ms",
    ]
    print(table(headers, rows))
    print()
    ok = True
    for count, speedup, fewer in ratios:
        verdict = "met" if speedup >= TARGET_RATIO else "NOT met"
        ok = ok and speedup >= TARGET_RATIO
        print(
            f"{count:>2} subscriber(s): coalesced delivers the same text {speedup:.1f}x faster "
            f"with {fewer:.0f}x fewer events; target >= {TARGET_RATIO:.0f}x: {verdict}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
