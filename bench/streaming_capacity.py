"""Concurrent streaming steps per worker process, against a slow upstream.

For each Celery pool (`--pools`, default threads and gevent), upstream rate R (`--rate`, deltas/s per
stream, default 50 = a realistic provider, and 100 = the stress rate) and concurrency C (default 50 100 200
300 400): a fresh worker process (`celery -A bench.celery_app worker --pool=POOL --concurrency=C`: stepq's
app, what `stepq worker --pool POOL` runs without beat, plus the benchmark's stage clocks) and C one-step
`anthropic` turns submitted at once. The fake upstream (bench/fake_upstream.py, its own asyncio process)
holds every stream until all C are open, then streams each (at a random phase) R x `--stream-s` text
deltas 1/R s apart (default 2 s), so C steps really stream at the same time. The worker keeps stepq's defaults (coalescing
window 10 ms, lease/cancel poll 50 ms).

Subscribers are `--subscribers` processes, each pattern-subscribed (one raw pub/sub connection,
subscribed before the first submit) to the channels of a share of the turns, by the turn id's first
hex digit. They measure, per event, **publish->recv** (the event's `ts`, stamped by the worker when
it publishes, to the time the subscriber's socket read returned) and, per delta, **upstream->recv**
(the fake stamps the write time into each delta's text: this adds the worker's own lag and the
coalescing window). A step **fails** if its turn does not complete, or it shows an `error` or
`step-retry` event, a seq gap, or fewer deltas than were streamed.

Each level runs `--repeat` rounds on its worker and shows the round with the median p99. Before the
levels, the upstream alone streams to a minimal asyncio reader, to show its own pacing under that load.

Bottleneck checks printed per level: the upstream's frame write lag against its schedule and its
CPU, each subscriber process's CPU (a subscriber near 100 % of a core would be the bottleneck), the
largest Redis output buffer (`omem`) of the subscriber connections (grows when a reader lags), and
the CPU of every part plus what other programs on the machine took. The upstream and the
subscribers run at nice -5 (`--probe-nice`), as if on machines of their own; the worker at 0.

Target (judged on what a user waits for): at 50 deltas/s, >= 300 concurrent streaming steps per worker
process with upstream->recv p99 <= 250 ms, every step's stream (first delta to turn-finish, p99 over
steps) <= 1.1x the upstream's duration, and no failed step, on the threads pool (`stepq worker`'s default;
another pool's levels are reported against the same bounds, not judged). The 100 deltas/s levels are the stress rate,
reported with the same checks but no target. publish->recv is still printed (Redis-side delivery).

On the threads pool, one more round per level (after the judged ones, never judged) runs with the stage
clocks on and prints the worker's CPU per delta by stage, measured with thread CPU clocks around the
engine's stage calls (bench/stages.py). The judged rounds run with the clocks off, as the worker a user
runs (a thread-clock pair per stage call, on the provider loop's thread for every chunk).

    .venv/bin/python -m bench.streaming_capacity --levels 50 100 200 300 400 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import stages, timeline
from bench._common import (
    DEFAULT_REDIS_URL,
    bench_settings,
    cleanup,
    median,
    output_path_problem,
    percentile,
    positive_count,
    process_cpu_seconds,
    profile_report,
    table,
    unique_prefix,
)
from bench.fake_upstream import Script, renice, running_upstream, sdk_env, stamps, stepq_worker
from stepq.producer.client import Client

AGENT = "bench.streamer"
HEX = "0123456789abcdef"
TARGET_C = 300  # concurrent streaming steps per worker process (moonshot 500)
TARGET_RATE = 50  # deltas/s per stream the target is judged at
DEFAULT_POOL = "threads"  # the target holds on what `stepq worker` runs with no flags
TARGET_UPSTREAM_P99_MS = 250.0  # upstream write -> subscriber receipt, p99 over every delta
TARGET_DURATION = 1.1  # a step's stream duration against the upstream's, p99 over steps
DEFAULT_RATES = [50, 100]


# ---------------------------------------------------------------------------- subscriber processes


class PubSubReader:
    """A raw RESP2 pub/sub connection: PSUBSCRIBE, then parse `pmessage` frames straight off the socket.
    Cheaper per message than redis-py's reader, so the subscriber side stays far from saturation."""

    def __init__(self, redis_url: str, name: str, patterns: list[str]) -> None:
        kw = redis.ConnectionPool.from_url(redis_url).connection_kwargs
        self.sock = socket.create_connection((kw.get("host", "127.0.0.1"), kw.get("port", 6379)))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.buf = b""
        if kw.get("password"):
            self._command("AUTH", *([kw["username"]] if kw.get("username") else []), kw["password"])
            self._expect_simple()
        self._command("CLIENT", "SETNAME", name)
        self._expect_simple()
        self._command("PSUBSCRIBE", *patterns)
        for _ in patterns:
            while self._next() is None:
                self._fill(None)

    def _command(self, *parts: str) -> None:
        out = [b"*%d\r\n" % len(parts)]
        for p in parts:
            b = p.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))

    def _expect_simple(self) -> None:
        while b"\r\n" not in self.buf:
            self._fill(None)
        line, _, self.buf = self.buf.partition(b"\r\n")
        if not line.startswith(b"+"):
            raise RuntimeError(f"redis said {line!r}")

    def _fill(self, timeout: float | None) -> bool:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return False
        if not data:
            raise ConnectionError("redis closed the subscriber connection (output buffer limit?)")
        self.buf += data
        return True

    def _next(self) -> list[bytes | int] | None:
        """One complete array frame from the buffer, or None if it is not all here yet."""
        buf = self.buf
        end = buf.find(b"\r\n")
        if end < 0:
            return None
        count = int(buf[1:end])
        pos = end + 2
        items: list[bytes | int] = []
        for _ in range(count):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return None
            head = buf[pos:end]
            if head[:1] == b":":
                items.append(int(head[1:]))
                pos = end + 2
                continue
            size = int(head[1:])
            start = end + 2
            if len(buf) < start + size + 2:
                return None
            items.append(buf[start : start + size])
            pos = start + size + 2
        self.buf = buf[pos:]
        return items

    def messages(self, timeout: float) -> tuple[float, list[bytes]]:
        """(receive time, payloads) of every pmessage that arrived within `timeout`."""
        if not self._fill(timeout):
            return 0.0, []
        received = time.time()
        out: list[bytes] = []
        while (frame := self._next()) is not None:
            if frame[0] == b"pmessage":
                out.append(frame[3])  # type: ignore[arg-type]
        return received, out


@dataclass
class TurnSeen:
    last_seq: int = 0
    gaps: int = 0
    deltas: int = 0
    errors: int = 0
    retries: int = 0
    status: str | None = None
    gap: str = ""  # the first gap seen
    first_delta: float = 0.0  # receive times
    last_delta: float = 0.0
    finished: float = 0.0


@dataclass
class SubStats:
    publish: array = field(default_factory=lambda: array("d"))
    upstream: array = field(default_factory=lambda: array("d"))
    turns: dict[str, TurnSeen] = field(default_factory=dict)
    events: int = 0


def subscriber_main(redis_url: str, prefix: str, index: int, digits: str, nice: int, ctl: Any, out: Any) -> None:
    """Follow every turn whose id starts with one of `digits`; answer the driver's commands on `ctl`."""
    renice(nice)
    pattern = f"{prefix}:turn:{{[{digits}]*:ch"  # a turn's home starts its id; its event channel
    reader = PubSubReader(redis_url, f"{prefix}-sub{index}", [pattern])
    out.put(("ready", index))
    stats = SubStats()
    expected: set[str] = set()
    cpu0, wall0 = time.process_time(), time.monotonic()
    told_done = False
    expecting = False  # told which turns to expect (maybe none: fewer turns than subscribers)
    while True:
        received, payloads = reader.messages(0.05)
        for payload in payloads:
            event = json.loads(payload)
            stats.events += 1
            stats.publish.append(received - event["ts"])
            seen = stats.turns.get(event["turn_id"])
            if seen is None:
                seen = stats.turns[event["turn_id"]] = TurnSeen()  # subscribed before submit: seq 1 comes first
            if event["seq"] != seen.last_seq + 1:
                seen.gaps += 1
                if not seen.gap:
                    seen.gap = f"seq {event['seq']} ({event['type']}) after {seen.last_seq}"
            seen.last_seq = max(seen.last_seq, event["seq"])
            kind = event["type"]
            if kind == "text-delta":
                written = stamps(event["data"]["text"])
                seen.first_delta = seen.first_delta or received
                seen.last_delta = received
                seen.deltas += len(written)
                stats.upstream.extend(received - t for t in written)
            elif kind == "error":
                seen.errors += 1
            elif kind == "step-retry":
                seen.retries += 1
            elif kind == "turn-finish":
                seen.status = event["data"]["status"]
                seen.finished = received
        if expecting and not told_done and all(stats.turns.get(t, TurnSeen()).status for t in expected):
            out.put(("done", index))
            told_done = True
        while not ctl.empty():
            command = ctl.get()
            if command[0] == "stop":
                return
            if command[0] == "reset":
                stats, expected, expecting, told_done = SubStats(), set(), False, False
                cpu0, wall0 = time.process_time(), time.monotonic()
                out.put(("reset", index))
            elif command[0] == "expect":
                expected = set(command[1])
                expecting, told_done = True, False
            elif command[0] == "report":
                cpu = 100 * (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9)
                turns = {t: vars(s) for t, s in stats.turns.items()}
                out.put(("report", index, stats.publish.tobytes(), stats.upstream.tobytes(), turns, stats.events, cpu))


class Subscribers:
    def __init__(self, count: int, redis_url: str, prefix: str, nice: int) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.ctl = [ctx.Queue() for _ in range(count)]
        self.digits = [HEX[i::count] for i in range(count)]
        self.procs = [
            ctx.Process(
                target=subscriber_main,
                args=(redis_url, prefix, i, self.digits[i], nice, self.ctl[i], self.out),
                daemon=True,
            )
            for i in range(count)
        ]
        for p in self.procs:
            p.start()
        self._collect("ready", timeout=60)

    def _collect(self, kind: str, timeout: float) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + timeout
        while len(got) < len(self.procs):
            msg = self.out.get(timeout=max(0.1, deadline - time.monotonic()))
            if msg[0] != kind:
                raise RuntimeError(f"subscriber {msg[1]} sent {msg[0]!r}, expected {kind!r}")
            got.append(msg)
        return got

    def reset(self) -> None:
        """Clear every subscriber's stats; returns once all have (so no event of the next level is wiped)."""
        for q in self.ctl:
            q.put(("reset",))
        self._collect("reset", timeout=60)

    def expect(self, turn_ids: list[str]) -> None:
        for q, digits in zip(self.ctl, self.digits, strict=True):
            q.put(("expect", [t for t in turn_ids if t[len("turn_")] in digits]))

    def wait_done(self, timeout: float) -> bool:
        try:
            self._collect("done", timeout)
            return True
        except queue.Empty:  # some turn never finished; the report says which
            return False

    def report(self) -> list[tuple[Any, ...]]:
        while not self.out.empty():  # a late "done" from a timed-out wait
            self.out.get()
        for q in self.ctl:
            q.put(("report",))
        return self._collect("report", timeout=60)

    def close(self) -> None:
        for q in self.ctl:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


# ---------------------------------------------------------------------------- sampling


class Sampler(threading.Thread):
    """Every 0.25 s: the largest output buffer Redis holds for our subscriber connections."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.prefix = prefix
        self.max_omem = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                clients = self.client.client_list(_type="pubsub")
            except redis.RedisError:
                continue
            for c in clients:
                if c.get("name", "").startswith(f"{self.prefix}-sub"):
                    self.max_omem = max(self.max_omem, int(c.get("omem", 0)))


# ---------------------------------------------------------------------------- the upstream alone


def calibrate(upstream: Any, args: argparse.Namespace, c: int) -> dict[str, Any]:
    """C streams from the fake to a minimal asyncio reader (no worker): the fake's own pacing under that load."""
    port = int(upstream.base_url.rsplit(":", 1)[1])
    request = b"POST /v1/messages HTTP/1.1\r\nhost: bench\r\ncontent-length: 2\r\n\r\n{}"

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        tail = b""
        while not tail.endswith(b"0\r\n\r\n"):  # the last chunk
            data = await reader.read(1 << 16)
            if not data:
                break
            tail = (tail + data)[-16:]
        writer.close()

    async def all_streams() -> None:
        await asyncio.gather(*(one() for _ in range(c)))

    upstream.configure(Script(first_ms=args.first_ms, deltas=args.deltas, interval_ms=args.interval_ms, gate=c))
    upstream.stats()
    asyncio.run(all_streams())
    return upstream.stats()


# ---------------------------------------------------------------------------- one level


@dataclass
class Level:
    concurrency: int
    pool: str = "threads"
    rate: int = 0  # upstream deltas/s per stream
    upstream_s: float = 0.0  # how long the upstream streams
    ok: int = 0
    failed: int = 0
    why: list[str] = field(default_factory=list)
    publish_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    upstream_ms: tuple[float, float] = (0.0, 0.0)
    stream_s: tuple[float, float] = (0.0, 0.0)  # first delta -> turn-finish, p50 / p99 over steps
    end_ms: tuple[float, float] = (0.0, 0.0)  # last delta -> turn-finish (the step's end), p50 / p99
    events_per_s: float = 0.0
    threads: int = 0
    sub_cpu_max: float = 0.0
    omem: int = 0
    up: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # % of one core, per component, over the level
    worker_us_per_delta: float = 0.0  # the worker's CPU over the level / upstream deltas it streamed
    round_p99s: list[float] = field(default_factory=list)  # p99 upstream->recv of every round
    round_ratios: list[float] = field(default_factory=list)  # stream/upstream (p99 over steps) of every round
    breakdown: dict[str, Any] | None = None  # the stage clocks' dump of the level's breakdown round (threads pool)
    window: tuple[float, float] = (0.0, 0.0)  # the round's wall-clock span (time.time()), submit to the last finish
    probe_us_per_delta: float = 0.0  # the worker's CPU per delta in that round, the clocks' own cost included

    @property
    def duration_ratio(self) -> float:
        return self.stream_s[1] / self.upstream_s if self.upstream_s else float("nan")

    @property
    def passed(self) -> bool:
        return (
            self.failed == 0
            and self.upstream_ms[1] <= TARGET_UPSTREAM_P99_MS
            and median(self.round_ratios or [self.duration_ratio]) <= TARGET_DURATION
        )


def pool_of(worker: subprocess.Popen[bytes]) -> str:
    return next((a.split("=", 1)[1] for a in map(str, worker.args) if a.startswith("--pool=")), "?")  # type: ignore[union-attr]


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine, all cores (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def redis_cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


class CpuMeter:
    """CPU of the worker, Redis, this process and the whole machine over one level."""

    def __init__(self, worker_pid: int, redis_client: redis.Redis) -> None:
        self.pid, self.redis = worker_pid, redis_client
        self.start = self._read()

    def _read(self) -> tuple[float, ...]:
        return (
            time.monotonic(),
            process_cpu_seconds(self.pid),
            redis_cpu_seconds(self.redis),
            time.process_time(),
            machine_cpu_seconds(),
        )

    def stop(self) -> dict[str, float]:
        end = self._read()
        wall = end[0] - self.start[0]
        worker, redis_s, driver, machine = (100 * (b - a) / wall for a, b in zip(self.start[1:], end[1:], strict=True))
        return {"worker": worker, "redis": redis_s, "driver": driver, "machine": machine}


def py_spy(pid: int, path: str, c: int) -> subprocess.Popen[bytes]:
    """Sample the worker's stacks (all threads, GIL holders and idle ones apart) while the level runs."""
    out = f"{path}.c{c}.txt"
    print(f"profiling the worker (py-spy, collapsed stacks) to {out}", flush=True)
    cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "200",
           "--duration", "2", "--format", "raw", "--output", out, "--nonblocking", "--gil"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_level(args: argparse.Namespace, client: Client, upstream: Any, subs: Subscribers, c: int, pool: str) -> Level:
    """A fresh worker process (Celery pool `pool`) with concurrency C; `--repeat` rounds of C turns; the round
    with the median p99 upstream->recv stands for the level (its other rounds' p99s are kept for the report)."""
    end_profile = f"{args.profile_end}.{pool}.c{c}.pstat" if args.profile_end and pool == "threads" else ""
    extra_env = {"STEPQ_BENCH_PROFILE_END": end_profile} if end_profile else {}
    timeline_path = f"{args.timeline}.{pool}.c{c}.json" if args.timeline and pool == "threads" else ""
    if timeline_path:
        extra_env["STEPQ_BENCH_TIMELINE"] = timeline_path
    with stepq_worker(
        client.settings, c, upstream.base_url, pool, app="bench.celery_app", extra_env=extra_env
    ) as worker:
        upstream.configure(Script(first_ms=0, deltas=5, interval_ms=1))  # warm-up: imports, first connection
        client.submit(AGENT, prompt="warm up").wait(timeout=120)
        rounds = [run_round(args, client, upstream, subs, c, worker, n) for n in range(args.repeat)]
        # the breakdown round: once more with the stage clocks recording, printed and never judged (the judged
        # rounds measure the worker a user runs, without the clocks' thread-clock pairs)
        probe = (
            run_round(args, client, upstream, subs, c, worker, args.repeat, clocks=True) if pool == "threads" else None
        )
    if end_profile:
        print(f"the steps' ends, cProfile on each step thread's CPU clock (all rounds and the warm-up), {end_profile}:")
        print(profile_report(end_profile, limit=25))
    ordered = sorted(rounds, key=lambda lv: (lv.failed > 0, lv.upstream_ms[1]))
    level = ordered[(len(ordered) - 1) // 2]
    if timeline_path:
        print(f"the timeline of the level's shown round (round {rounds.index(level) + 1}), {timeline_path}:")
        print(timeline.report(timeline_path, level.window))
    level.round_p99s = [lv.upstream_ms[1] for lv in rounds]
    level.round_ratios = [lv.duration_ratio for lv in rounds]
    level.failed = max(lv.failed for lv in rounds)  # a failure in any round fails the level
    if probe is not None:
        level.breakdown, level.probe_us_per_delta = probe.breakdown, probe.worker_us_per_delta
    level.ok = c - level.failed
    level.pool = pool
    return level


def run_round(
    args: argparse.Namespace,
    client: Client,
    upstream: Any,
    subs: Subscribers,
    c: int,
    worker: subprocess.Popen[bytes],
    round_no: int,
    clocks: bool = False,
) -> Level:
    """One round of C turns; with `clocks` (threads pool only: greenlets share one thread's CPU clock), the
    stage clocks record it and their dump is kept as the round's breakdown."""
    settings = client.settings
    level = Level(c, pool=pool_of(worker), rate=args.rate, upstream_s=args.deltas * args.interval_ms / 1000)
    if clocks:
        stages.ask(client, "reset")
    script = Script(first_ms=args.first_ms, deltas=args.deltas, interval_ms=args.interval_ms, gate=c)
    upstream.configure(script)
    subs.reset()
    upstream.stats()
    sampler = Sampler(args.redis_url, settings.key_prefix)
    sampler.start()
    meter = CpuMeter(worker.pid, client.runtime.redis)
    wall0, started = time.monotonic(), time.time()
    handles = [client.submit(AGENT, prompt=f"stream {i}") for i in range(c)]
    submitted = time.monotonic() - wall0
    spy = None
    profiled = args.profile and round_no == 0 and c in (args.profile_levels or [c])
    if profiled and upstream.wait_streaming(c, args.timeout):
        spy = py_spy(worker.pid, args.profile, c)  # steady state: every stream is flowing
    subs.expect([h.turn_id for h in handles])
    threads = threads_of(worker.pid)
    finished = subs.wait_done(timeout=args.timeout)
    level.window = (started, time.time())
    level.threads = max(threads, threads_of(worker.pid))
    wall = time.monotonic() - wall0
    level.cpu = meter.stop()
    if clocks:
        level.breakdown = stages.ask(client, "dump")
    level.worker_us_per_delta = level.cpu["worker"] / 100 * wall * 1e6 / (c * args.deltas)
    sampler.stop.set()
    sampler.join()
    level.omem = sampler.max_omem
    level.up = upstream.stats()
    reports = subs.report()
    if spy is not None:
        spy.wait()
    publish, upstream_lat = array("d"), array("d")
    turns: dict[str, dict[str, Any]] = {}
    events = 0
    level.cpu["subscribers"] = 0.0
    for _, _, pub, ups, seen, count, cpu in reports:
        publish.frombytes(pub)
        upstream_lat.frombytes(ups)
        turns.update(seen)
        events += count
        level.sub_cpu_max = max(level.sub_cpu_max, cpu)
        level.cpu["subscribers"] += cpu
    level.cpu["upstream"] = level.up["cpu_pct"]
    ours = ("worker", "redis", "driver", "subscribers", "upstream")
    level.cpu["others"] = max(0.0, level.cpu["machine"] - sum(level.cpu[k] for k in ours))
    seen_turns = [t for h in handles if (t := turns.get(h.turn_id)) and t["finished"] and t["first_delta"]]
    durations = [t["finished"] - t["first_delta"] for t in seen_turns]
    level.stream_s = (percentile(durations, 50), percentile(durations, 99))
    ends = [(t["finished"] - t["last_delta"]) * 1000 for t in seen_turns]
    level.end_ms = (percentile(ends, 50), percentile(ends, 99))
    if seen_turns:
        streaming = max(t["finished"] for t in seen_turns) - min(t["first_delta"] for t in seen_turns)
        level.events_per_s = events / max(streaming, 1e-9)
    for h in handles:
        seen = turns.get(h.turn_id)
        problem = None
        if seen is None or seen["status"] is None:
            problem = "did not finish"
        elif seen["status"] != "completed":
            problem = f"ended {seen['status']}"
        elif seen["errors"] or seen["retries"]:
            problem = f"{seen['errors']} error / {seen['retries']} step-retry events"
        elif seen["gaps"]:
            problem = f"{seen['gaps']} seq gaps (first: {seen['gap']})"
        elif seen["deltas"] != args.deltas:
            problem = f"{seen['deltas']} of {args.deltas} deltas"
        if problem:
            level.failed += 1
            if len(level.why) < 3:
                level.why.append(f"{h.turn_id}: {problem}")
        else:
            level.ok += 1
    if not finished and not level.why:
        level.why.append("timed out waiting for turn-finish events")
    pub_list, up_list = list(publish), list(upstream_lat)
    level.publish_ms = (percentile(pub_list, 50) * 1000, percentile(pub_list, 99) * 1000, max(pub_list) * 1000)
    level.upstream_ms = (percentile(up_list, 50) * 1000, percentile(up_list, 99) * 1000)
    label = "breakdown round (stage clocks on, not judged)" if clocks else f"round {round_no + 1}"
    print(
        f"{level.pool} {args.rate}/s C={c} {label}: {level.ok} ok, {level.failed} failed; {wall:.1f}s; submit {submitted:.2f}s; all streams open after "
        f"{level.up['gate_wait_s']:.2f}s; stream p50 {level.stream_s[0]:.2f}s p99 {level.stream_s[1]:.2f}s "
        f"({level.duration_ratio:.2f}x the upstream's; last delta -> turn-finish p50 {level.end_ms[0]:.0f} / p99 "
        f"{level.end_ms[1]:.0f} ms); publish->recv p99 "
        f"{level.publish_ms[1]:.1f} ms; upstream->recv p99 {level.upstream_ms[1]:.1f} ms; worker CPU "
        f"{level.cpu['worker']:.0f}%{'; ' + '; '.join(level.why) if level.why else ''}",
        flush=True,
    )
    return level


RESULT_HEADERS = [
    "pool",
    "rate/s",
    "C",
    "ok/failed",
    "streams open",
    "upstream->recv p50/p99 ms",
    "p99 per round ms",
    "step stream p50/p99 s",
    "stream/upstream",
    "per round",
    "publish->recv p50/p99/max ms",
    "events/s",
    "pass",
]
CHECK_HEADERS = [
    "pool",
    "rate/s",
    "C",
    "worker threads",
    "worker cpu us/delta",
    "cpu % worker / redis / upstream / subs / driver / others",
    "busiest sub cpu %",
    "sub omem max B",
    "upstream lag p99/max ms",
]
LEGEND = """
Each level is its round with the median upstream->recv p99 (of --repeat rounds on one worker process); a
failed step in any round fails the level. pass: no failed step, upstream->recv p99 <= {up_ms:.0f} ms and
the median over rounds of stream/upstream <= {dur:g}. streams open: most upstream streams open at once. step
stream: a step's first delta to its turn-finish (the upstream streams for {stream_s:g} s); stream/upstream:
its p99 over steps divided by that (per round: every round's, in order). events/s: events received by all subscribers while steps streamed. worker cpu us/delta:
the worker's CPU over the round (submit to the last turn-finish) per delta the upstream streamed. cpu %: of
one core over the round; others = the machine's busy CPU minus all of these (other programs). busiest sub
cpu: one subscriber process, % of one core. omem: the largest Redis output buffer of a subscriber
connection (it grows when a reader falls behind). upstream lag: how late the fake wrote frames against its
own schedule. The stage breakdown (threads pool) is thread CPU time around the engine's stage calls, from one more
round per level with the clocks on (not judged; the judged rounds run with them off)."""


def result_row(lv: Level) -> list[str]:
    return [
        lv.pool,
        str(lv.rate),
        str(lv.concurrency),
        f"{lv.ok}/{lv.failed}",
        str(lv.up.get("max_open", 0)),
        f"{lv.upstream_ms[0]:.1f} / {lv.upstream_ms[1]:.1f}",
        " ".join(f"{p:.0f}" for p in lv.round_p99s),
        f"{lv.stream_s[0]:.2f} / {lv.stream_s[1]:.2f}",
        f"{lv.duration_ratio:.2f}x",
        " ".join(f"{r:.2f}" for r in lv.round_ratios or [lv.duration_ratio]),
        f"{lv.publish_ms[0]:.1f} / {lv.publish_ms[1]:.1f} / {lv.publish_ms[2]:.0f}",
        f"{lv.events_per_s:,.0f}",
        "yes" if lv.passed else "no",
    ]


def check_row(lv: Level) -> list[str]:
    parts = ("worker", "redis", "upstream", "subscribers", "driver", "others")
    return [
        lv.pool,
        str(lv.rate),
        str(lv.concurrency),
        str(lv.threads),
        f"{lv.worker_us_per_delta:.0f}",
        " / ".join(f"{lv.cpu.get(k, 0):.0f}" for k in parts),
        f"{lv.sub_cpu_max:.0f}",
        str(lv.omem),
        f"{lv.up.get('lag_p99_ms', 0):.1f} / {lv.up.get('lag_max_ms', 0):.0f}",
    ]


def renice_allowed(nice: int) -> bool:
    """Whether this user may lower a priority to `nice` (tried on a throwaway child, not on this process)."""
    if nice >= 0:
        return True
    code = f"import os; os.setpriority(os.PRIO_PROCESS, 0, {nice})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--levels", type=positive_count, nargs="+", default=[50, 100, 200, 300, 400], help="concurrencies"
    )
    parser.add_argument(
        "--pools",
        nargs="+",
        choices=["threads", "gevent"],
        default=["threads", "gevent"],
        help="Celery pools to run every level with (default: threads gevent)",
    )
    parser.add_argument(
        "--rate",
        type=positive_count,
        nargs="+",
        default=DEFAULT_RATES,
        help=f"upstream deltas/s per stream; every level runs at each (default {DEFAULT_RATES}: the target is "
        f"judged at {TARGET_RATE}, a realistic provider; 100 is the stress rate)",
    )
    parser.add_argument("--stream-s", type=float, default=2.0, help="how long each upstream stream lasts (2 s)")
    parser.add_argument("--first-ms", type=float, default=50.0, help="upstream latency to the first event")
    parser.add_argument("--subscribers", type=positive_count, default=4, help="subscriber processes (default 4)")
    parser.add_argument("--repeat", type=positive_count, default=3, help="rounds per level; the median round is shown")
    parser.add_argument(
        "--probe-nice",
        type=int,
        default=-5,
        help="scheduling priority of the fake upstream and the subscribers (default -5: served before other "
        "programs, as if on machines of their own; needs root, else ignored). The worker keeps the default (0).",
    )
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--timeout", type=float, default=120.0, help="per level, after the last submit")
    parser.add_argument("--profile", metavar="PATH", help="py-spy the worker during each level: PATH.c<C>.txt")
    parser.add_argument("--profile-levels", type=int, nargs="*", help="only these levels (default: all)")
    parser.add_argument(
        "--profile-end",
        metavar="PATH",
        help="cProfile each step's end (stream's last byte to the task's end, threads pool): PATH.threads.c<C>.pstat",
    )
    parser.add_argument(
        "--timeline",
        metavar="PATH",
        help="record the provider loop's lag per delta and each step's end on the clock (threads pool), and print "
        "them for the level's shown round: PATH.threads.c<C>.json",
    )
    args = parser.parse_args(argv)

    prefix = unique_prefix("cap")
    settings = bench_settings(args.redis_url, prefix, agent_modules=["bench.fake_upstream"])
    stream_s = args.stream_s
    for flag, path in (("--profile", args.profile), ("--profile-end", args.profile_end), ("--timeline", args.timeline)):
        problem = output_path_problem(flag, path)
        if problem:
            parser.error(problem)
    print(
        f"run {prefix}: per step {stream_s:g} s of deltas at {args.rate} deltas/s (after {args.first_ms:g} ms); "
        f"levels {args.levels}; pools {args.pools}; one worker process per level; "
        f"{args.subscribers} subscriber processes; "
        f"upstream and subscribers at nice {args.probe_nice if renice_allowed(args.probe_nice) else 0}, worker at 0",
        flush=True,
    )
    levels: list[Level] = []
    subs = None
    try:
        subs = Subscribers(args.subscribers, args.redis_url, prefix, args.probe_nice)
        with running_upstream(Script(), args.probe_nice) as upstream:
            os.environ.pop("ANTHROPIC_AUTH_TOKEN", None)
            os.environ.update(sdk_env(upstream.base_url))  # submit checks that a key is configured
            client = Client(settings)
            top = max(args.levels)
            alone = calibrate(upstream, at_rate(args, max(args.rate)), top)
            print(
                f"upstream alone ({top} streams to a minimal asyncio reader, no worker): frame write lag p50 "
                f"{alone['lag_p50_ms']:.1f} / p99 {alone['lag_p99_ms']:.1f} / max {alone['lag_max_ms']:.1f} ms, "
                f"its CPU {alone['cpu_pct']:.0f}% of a core",
                flush=True,
            )
            for pool in args.pools:
                for rate in args.rate:
                    for c in args.levels:
                        levels.append(run_level(at_rate(args, rate), client, upstream, subs, c, pool))
    finally:
        if subs is not None:
            subs.close()
        print(f"cleaned up {cleanup(args.redis_url, prefix)} keys under {prefix}")

    print()
    print(table(RESULT_HEADERS, [result_row(lv) for lv in levels]))
    print()
    print(table(CHECK_HEADERS, [check_row(lv) for lv in levels]))
    for lv in levels:
        if lv.breakdown is not None:
            print()
            print(
                f"{lv.pool} {lv.rate}/s C={lv.concurrency} (its breakdown round, stage clocks on: "
                f"{lv.probe_us_per_delta:.0f} us/delta against {lv.worker_us_per_delta:.0f} in the judged round): ",
                end="",
            )
            print(stages.breakdown(lv.breakdown, lv.concurrency * round(lv.rate * lv.upstream_s), "delta"))
    if any(lv.breakdown is None for lv in levels):
        print("\n(no stage breakdown for the gevent pool: its greenlets share one thread's CPU clock)")
    met = False
    print()
    for pool in args.pools:
        for rate in args.rate:
            best = max(
                (lv.concurrency for lv in levels if lv.passed and lv.pool == pool and lv.rate == rate), default=0
            )
            verdict = "no target (stress rate)"
            if rate == TARGET_RATE and pool != DEFAULT_POOL:
                verdict = f"target >= {TARGET_C}: {'met' if best >= TARGET_C else 'not met'}, not judged (only {DEFAULT_POOL} is)"
            elif rate == TARGET_RATE:
                met = best >= TARGET_C
                verdict = f"target >= {TARGET_C}: {'met' if met else 'NOT met'}"
            print(
                f"--pool {pool} at {rate} deltas/s: highest concurrency with upstream->recv p99 <= "
                f"{TARGET_UPSTREAM_P99_MS:.0f} ms, stream <= {TARGET_DURATION:g}x the upstream's and no failed step: "
                f"{best or 'none'} of {args.levels} ({verdict})"
            )
    if TARGET_RATE not in args.rate or DEFAULT_POOL not in args.pools:
        print(f"no level ran on the {DEFAULT_POOL} pool at {TARGET_RATE} deltas/s: no verdict on the target")
    print(LEGEND.format(stream_s=stream_s, up_ms=TARGET_UPSTREAM_P99_MS, dur=TARGET_DURATION))
    return 0 if met else 1


def at_rate(args: argparse.Namespace, rate: int) -> argparse.Namespace:
    """The arguments of one rate's levels: `rate` x `--stream-s` deltas, 1/rate s apart."""
    return argparse.Namespace(
        **{**vars(args), "rate": rate, "deltas": round(rate * args.stream_s), "interval_ms": 1000 / rate}
    )


if __name__ == "__main__":
    sys.exit(main())
