"""Time to first chunk: a full stepq turn vs the Anthropic SDK called directly, same fake upstream.

Every side talks to one paced fake Messages API (bench/fake_upstream.py, its own process) with the
same script: `--first-ms` before the first event, then `--deltas` text deltas `--interval-ms` apart.

- **direct**: `client.messages.create(stream=True)` on a warm SDK client, timed from the call to the
  first `content_block_delta`.
- **stepq**: `Client.submit` of a one-step `anthropic` turn -> Celery `run_step` on one worker
  subprocess (threads pool) over the real local Redis -> the first `text-delta` event received by a
  subscriber (a pub/sub subscription on the run's turn channels, open before the submit). Timed from
  the call to `submit`.
- **plain Celery task**: `send_task` of a task on a plain Celery app (bench/plain_celery.py: Celery's
  defaults plus late acks and prefetch 1, nothing of stepq; its own worker subprocess, threads pool, same
  concurrency) that calls the SDK and PUBLISHes each text delta as it arrives, received by the same
  subscriber. Timed from the `send_task` call. The least a Celery-based streaming design does (no store,
  no lease, no durability): what is left of stepq's added time over it is stepq's own.
- **bare Redis hop**: the plain task's body with no Celery: a worker subprocess BRPOPs the run id from a
  Redis list (`python -m bench.plain_celery bare`), calls the SDK and PUBLISHes each text delta; timed from
  the LPUSH. The floor of any design that hands the call to another process through Redis and fans its
  chunks out through pub/sub: the plain task's time over it is Celery's own send and consumer.

Turns run one at a time (each drained to its end before the next), the four sides in turn, after a warm-up.
Prints p50/p95 per side, the ratios to the direct call and the verdict: stepq's p50 within 1.03x and 1.5 ms
of the direct call's (exit 0 when met, 1 when not).

    .venv/bin/python -m bench.provider_ttfc --turns 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable

import anthropic
import redis
from celery import Celery

from bench._common import (
    DEFAULT_REDIS_URL,
    bench_settings,
    cleanup,
    percentile,
    positive_count,
    running_bare_worker,
    running_plain_worker,
    table,
    unique_prefix,
)
from bench.fake_upstream import Script, running_upstream, sdk_env, stamps, stepq_worker
from bench.plain_celery import PLAIN_STREAM, bare_queue, build_plain_app, open_answer_stream, plain_queue
from stepq.models import TurnStatus
from stepq.producer.client import Client

AGENT = "bench.streamer"
PROMPT = "Say something."
TARGET_RATIO = 1.03  # issue 23: stepq's time to first chunk within 1.03x the SDK called directly ...
TARGET_ADDED_MS = 1.5  # ... and at most 1.5 ms more, at p50


class FirstChunks:
    """A subscriber thread: pattern-subscribed to every turn channel of the run before any submit; notes
    when each turn's first `step-start` and first `text-delta` arrive (perf_counter)."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self._client = redis.Redis.from_url(redis_url)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.psubscribe(f"{prefix}:turn:*:ch")
        self._cond = threading.Condition()
        self.step_start: dict[str, float] = {}
        self.first_delta: dict[str, float] = {}
        self.first_written: dict[str, float] = {}  # seconds from the fake's write of that first delta
        self.finished: set[str] = set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="ttfc-subscriber", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            message = self._pubsub.get_message(timeout=0.5)
            if message is None:
                continue
            received, received_wall = time.perf_counter(), time.time()
            event = json.loads(message["data"])
            kind, turn_id = event["type"], event["turn_id"]
            with self._cond:
                if kind == "step-start":
                    self.step_start.setdefault(turn_id, received)
                elif kind == "text-delta" and turn_id not in self.first_delta:
                    self.first_delta[turn_id] = received
                    self.first_written[turn_id] = received_wall - stamps(event["data"]["text"])[0]
                    self._cond.notify_all()
                elif kind == "turn-finish":
                    self.finished.add(turn_id)
                    self._cond.notify_all()

    def wait_first_delta(self, turn_id: str, timeout: float) -> tuple[float, float]:
        """When the turn's first text delta arrived (perf_counter), and seconds since the fake wrote it."""
        with self._cond:
            if not self._cond.wait_for(lambda: turn_id in self.first_delta, timeout=timeout):
                raise TimeoutError(f"no text-delta on turn {turn_id} within {timeout}s")
            return self.first_delta[turn_id], self.first_written[turn_id]

    def wait_finished(self, turn_id: str, timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: turn_id in self.finished, timeout=timeout):
                raise TimeoutError(f"no turn-finish on {turn_id} within {timeout}s")

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        self._pubsub.close()
        self._client.close()


def stepq_turn(client: Client, sub: FirstChunks, timeout: float) -> dict[str, float]:
    """One turn: seconds from submit to submit() returning, to step-start and to the first text-delta."""
    started, started_wall = time.perf_counter(), time.time()
    handle = client.submit(AGENT, prompt=PROMPT)
    submitted = time.perf_counter()
    first, from_write = sub.wait_first_delta(handle.turn_id, timeout)
    result = handle.wait(timeout=timeout)  # drain: the next turn starts on an idle worker
    if result.status != TurnStatus.COMPLETED:
        raise RuntimeError(f"turn {handle.turn_id} ended {result.status.value}: {result.error}")
    began = client.get(handle.turn_id).started_at  # the worker's clock (this machine's) as the step began
    if began is None:
        raise RuntimeError(f"turn {handle.turn_id} has no started_at")
    return {
        "submit": submitted - started,
        "began": began - started_wall,
        "step_start": sub.step_start[handle.turn_id] - started,
        "first": first - started,
        "from_write": from_write,
    }


def sent_turn(send: Callable[[str], object], run_id: str, sub: FirstChunks, timeout: float) -> tuple[float, float]:
    """One run of a baseline side: seconds from `send(run_id)` to its first published text delta, and from the
    fake's write of that delta to its arrival; drained, so the next call starts on an idle worker."""
    started = time.perf_counter()
    send(run_id)
    first, from_write = sub.wait_first_delta(run_id, timeout)
    sub.wait_finished(run_id, timeout)
    return first - started, from_write


def plain_turn(app: Celery, queue: str, sub: FirstChunks, n: int, timeout: float) -> tuple[float, float]:
    """One plain Celery streaming task, timed from `send_task`."""
    return sent_turn(
        lambda run_id: app.send_task(PLAIN_STREAM, args=[run_id, PROMPT], queue=queue), f"plain-{n}", sub, timeout
    )


def bare_turn(client: redis.Redis, queue: str, sub: FirstChunks, n: int, timeout: float) -> tuple[float, float]:
    """One bare hop, timed from the LPUSH of its run id."""
    return sent_turn(lambda run_id: client.lpush(queue, run_id), f"bare-{n}", sub, timeout)


def verdict(direct_p50_s: float, stepq_p50_s: float) -> tuple[bool, str]:
    """Whether stepq's p50 time to first chunk is within the target of the direct call's, and the line saying so."""
    ratio, added_ms = stepq_p50_s / direct_p50_s, (stepq_p50_s - direct_p50_s) * 1000
    met = ratio <= TARGET_RATIO and added_ms <= TARGET_ADDED_MS
    return met, (
        f"stepq time to first chunk: {ratio:.2f}x the SDK called directly, {added_ms:+.1f} ms at p50; target "
        f"<= {TARGET_RATIO:g}x and <= {TARGET_ADDED_MS:g} ms added: {'met' if met else 'not met'}."
    )


def direct_call(sdk: anthropic.Anthropic) -> tuple[float, float]:
    """Seconds from messages.create(stream=True) to the first text delta, and from the fake's write of that
    delta to its arrival; the stream is drained."""
    started = time.perf_counter()
    first = from_write = None
    with open_answer_stream(sdk, PROMPT) as events:
        for event in events:
            if first is None and event.type == "content_block_delta" and event.delta.type == "text_delta":
                first, from_write = time.perf_counter() - started, time.time() - stamps(event.delta.text)[0]
    if first is None or from_write is None:
        raise RuntimeError("the direct stream had no text delta")
    return first, from_write


def round_trip_s(redis_url: str, idle_s: float, n: int = 40) -> float:
    """p50 of a Redis PING after `idle_s` asleep: what one sequential wake-up costs on this machine. Each turn
    here starts with every process asleep (the upstream's 50 ms), and a VM can take ~10x longer to wake a
    process then than back to back: that, times the hops before the request, is most of what a side adds."""
    client = redis.Redis.from_url(redis_url)
    times = []
    try:
        client.ping()
        for _ in range(n):
            if idle_s:
                time.sleep(idle_s)  # the condition measured (asleep), not a synchronization
            started = time.perf_counter()
            client.ping()
            times.append(time.perf_counter() - started)
    finally:
        client.close()
    return percentile(times, 50)


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=positive_count, default=50, help="measured turns per side (default 50)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured turns per side first (default 3)")
    parser.add_argument("--first-ms", type=float, default=50.0, help="upstream latency before the first event")
    parser.add_argument("--deltas", type=positive_count, default=20, help="text deltas per stream (default 20)")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="gap between deltas (default 10)")
    parser.add_argument(
        "--concurrency", type=positive_count, default=32, help="worker threads (default 32, as stepq worker)"
    )
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)

    prefix = unique_prefix("ttfc")
    settings = bench_settings(args.redis_url, prefix, agent_modules=["bench.fake_upstream"])
    script = Script(first_ms=args.first_ms, deltas=args.deltas, interval_ms=args.interval_ms)
    print(
        f"run {prefix}: upstream first event after {script.first_ms:g} ms, then {script.deltas} deltas every "
        f"{script.interval_ms:g} ms; {args.turns} turns per side (+{args.warmup} warm-up), sequential; "
        f"one worker process (threads pool, concurrency {args.concurrency})",
        flush=True,
    )
    sub = None
    try:
        with running_upstream(script) as upstream:
            os.environ.pop("ANTHROPIC_AUTH_TOKEN", None)
            os.environ.update(sdk_env(upstream.base_url))  # submit checks the key; the direct SDK reads both
            sdk = anthropic.Anthropic(max_retries=0)
            client = Client(settings)
            sub = FirstChunks(args.redis_url, prefix)
            plain_app, queue = build_plain_app(args.redis_url, prefix), plain_queue(prefix)
            with (
                stepq_worker(settings, args.concurrency, upstream.base_url),
                running_plain_worker(args.redis_url, prefix, args.concurrency),
                running_bare_worker(args.redis_url, prefix, PROMPT),
                redis.Redis.from_url(args.redis_url) as pusher,
            ):
                for n in range(args.warmup):
                    stepq_turn(client, sub, timeout=120)  # the first also waits for the workers to start
                    plain_turn(plain_app, queue, sub, -1 - n, timeout=120)
                    bare_turn(pusher, bare_queue(prefix), sub, -1 - n, timeout=120)
                    direct_call(sdk)
                upstream.stats()  # reset: count only the measured streams
                stepq: list[dict[str, float]] = []
                plain_runs: list[tuple[float, float]] = []
                bare_runs: list[tuple[float, float]] = []
                direct_runs: list[tuple[float, float]] = []
                for n in range(args.turns):
                    stepq.append(stepq_turn(client, sub, args.timeout))
                    plain_runs.append(plain_turn(plain_app, queue, sub, n, args.timeout))
                    bare_runs.append(bare_turn(pusher, bare_queue(prefix), sub, n, args.timeout))
                    direct_runs.append(direct_call(sdk))
                up = upstream.stats()

        first = [a["first"] for a in stepq]
        plain, bare, direct = [p[0] for p in plain_runs], [b[0] for b in bare_runs], [d[0] for d in direct_runs]
        rows = [
            [name, str(len(v)), ms(v, 50), ms(v, 95), ms(v, 0), ms(v, 100), f"{percentile(v, 50) / percentile(direct, 50):.2f}x",
             f"{(percentile(v, 50) - percentile(direct, 50)) * 1000:+.1f}"]
            for name, v in (
                ("direct SDK", direct), ("bare Redis hop", bare), ("plain Celery task", plain), ("stepq turn", first)
            )
        ]  # fmt: skip
        print()
        headers = ["time to first chunk", "n", "p50 ms", "p95 ms", "min ms", "max ms", "p50 / direct", "added ms p50"]
        print(table(headers, rows))
        r95 = percentile(first, 95) / percentile(direct, 95)
        met, line = verdict(percentile(direct, 50), percentile(first, 50))
        print(f"\n{line} (p95: {r95:.2f}x; the upstream's own first-event latency: {script.first_ms:g} ms)")
        over_plain = (percentile(first, 50) - percentile(plain, 50)) * 1000
        plain_added = (percentile(plain, 50) - percentile(direct, 50)) * 1000
        bare_added = (percentile(bare, 50) - percentile(direct, 50)) * 1000
        print(
            f"a bare Redis hop (LPUSH -> BRPOP worker -> the SDK -> PUBLISH, no Celery) adds {bare_added:+.1f} ms at p50: the "
            "floor of any design\nthat hands the call to a worker through Redis and fans its chunks out through pub/sub "
            f"on this machine;\na plain Celery task doing the same adds {plain_added:+.1f} ms (Celery's send and consumer: "
            f"{plain_added - bare_added:+.1f} ms over the bare hop); stepq adds {over_plain:+.1f} ms over the plain task"
        )
        parts = [
            ["submit() returns", ms([a["submit"] for a in stepq], 50), ms([a["submit"] for a in stepq], 95)],
            ["step began on the worker", ms([a["began"] for a in stepq], 50), ms([a["began"] for a in stepq], 95)],
            ["step-start received", ms([a["step_start"] for a in stepq], 50), ms([a["step_start"] for a in stepq], 95)],
            ["first text-delta received", ms(first, 50), ms(first, 95)],
        ]  # fmt: skip
        print("\nstepq turn, from the submit call:")
        print(table(["milestone", "p50 ms", "p95 ms"], parts))
        lead_s = script.first_ms / 1000
        sides = (
            ("direct SDK", direct, [d[1] for d in direct_runs]),
            ("bare Redis hop", bare, [b[1] for b in bare_runs]),
            ("plain Celery task", plain, [p[1] for p in plain_runs]),
            ("stepq turn", first, [a["from_write"] for a in stepq]),
        )
        writes = [
            [name, ms([t - w - lead_s for t, w in zip(total, tail, strict=True)], 50), ms(tail, 50), ms(tail, 95)]
            for name, total, tail in sides
        ]
        print(
            "\neach side's way to the upstream and back: its request at the upstream (the first delta's write, less the"
            f"\nupstream's {script.first_ms:g} ms; the fake's ~1 ms pacing lag included), and the fake's write of the first"
            "\ndelta to its arrival:"
        )
        print(table(["side", "request at the upstream p50 ms", "write -> arrival p50 ms", "p95 ms"], writes))
        idle, hot = round_trip_s(args.redis_url, script.first_ms / 1000), round_trip_s(args.redis_url, 0.0)
        print(
            f"\na Redis round trip on this machine: {idle * 1000:.2f} ms at p50 after {script.first_ms:g} ms asleep (as every"
            f" process is at each turn's start here), {hot * 1000:.2f} ms back to back"
        )
        print(
            f"upstream: {up['streams']} measured streams, frame write lag p50 {up['lag_p50_ms']:.2f} ms / "
            f"p99 {up['lag_p99_ms']:.2f} ms / max {up['lag_max_ms']:.2f} ms (its own pacing accuracy)"
        )
        return 0 if met else 1
    finally:
        if sub is not None:
            sub.close()
        print(f"cleaned up {cleanup(args.redis_url, prefix)} keys under {prefix}")


if __name__ == "__main__":
    sys.exit(main())
