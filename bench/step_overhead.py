"""stepq's per-step overhead against the bare Celery hop, on one worker and one broker.

(a) bare Celery: a no-op task that re-enqueues itself N times (same app, same broker config as
    stepq: `stepq.fleet.protocol.celery_config`), timed from the first enqueue to the Nth execution.
(b) stepq: turns of N steps (zero-latency scripted model + one trivial tool per step) submitted
    with `stepq.Client` and awaited with `Client.wait`; ms/step = total / N.

Both run against the same single worker (threads pool, concurrency 1), alternating per round.
Target: stepq ms/step <= 2x the bare Celery ms/hop.

    .venv/bin/python -m bench.step_overhead --steps 200 --turns 3 --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable

from bench._common import (
    DEFAULT_REDIS_URL,
    bench_settings,
    cleanup,
    median,
    now,
    profile_report,
    running_worker,
    table,
    unique_prefix,
)
from bench.celery_app import NOOP, done_key
from stepq.models import FinishReason, TurnStatus
from stepq.producer.client import Client

AGENT = "bench.overhead"
TARGET_RATIO = 2.0
CpuClock = Callable[[], float] | None


def bare_chain(client: Client, steps: int, timeout: float) -> float:
    """Seconds from the first enqueue of the no-op chain to its Nth execution."""
    settings = client.settings
    run_id = uuid.uuid4().hex
    key = done_key(settings, run_id)
    redis = client.runtime.redis
    started = now()
    client.celery.send_task(NOOP, args=[run_id, steps], queue=settings.queue)
    if redis.blpop([key], timeout=int(timeout)) is None:
        raise TimeoutError(f"bare Celery chain of {steps} did not finish in {timeout}s")
    elapsed = now() - started
    redis.delete(key)
    return elapsed


def stepq_turn(client: Client, steps: int, timeout: float) -> float:
    """Seconds from submit to `Client.wait` returning, for one turn of exactly `steps` steps."""
    started = now()
    handle = client.submit(AGENT, prompt="go", loop={"max_steps": steps})
    result = handle.wait(timeout=timeout)
    elapsed = now() - started
    if result.status != TurnStatus.COMPLETED or result.finish_reason != FinishReason.MAX_STEPS:
        raise RuntimeError(f"benchmark turn ended {result.status}/{result.finish_reason}: {result.error}")
    if len(result.trace.steps) != steps:
        raise RuntimeError(f"benchmark turn ran {len(result.trace.steps)} steps, expected {steps}")
    return elapsed


def measured(run: Callable[[], float], cpu: CpuClock) -> tuple[float, float | None, float]:
    """(wall seconds, worker CPU seconds or None, this process's CPU seconds) of one run."""
    before, own = (cpu() if cpu else 0.0), time.process_time()
    wall = run()
    return wall, (cpu() - before if cpu else None), time.process_time() - own


def fmt_cpu(values: list[float | None], steps: int) -> str:
    known = [v for v in values if v is not None]
    return f"{median(known) * 1000 / steps:.3f}" if known else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="steps per turn = hops per chain (default 200)")
    parser.add_argument("--turns", type=int, default=3, help="turns (and chains) per round (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of chains then turns (default 3)")
    parser.add_argument("--worker", choices=["process", "thread"], default="process", help="default: process")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--profile", metavar="PATH", help="cProfile the worker's task bodies; stats to PATH")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 1000:
        parser.error("--steps must be 1..1000 (LoopConfig.max_steps allows at most 1000)")
    n = args.steps

    prefix = unique_prefix("step")
    settings = bench_settings(args.redis_url, prefix)
    client = Client(settings)
    print(
        f"run {prefix}: {args.worker} worker (threads pool, concurrency 1), "
        f"steps={n}, turns={args.turns}, repeat={args.repeat}",
        flush=True,
    )
    walls: dict[str, list[float]] = {"bare": [], "stepq": []}
    cpus: dict[str, list[float | None]] = {"bare": [], "stepq": []}
    client_cpu: list[float | None] = []
    rows: list[list[str]] = []
    try:
        with running_worker(settings, args.worker, args.profile) as cpu:
            bare_chain(client, 5, timeout=120)  # warm-up: proves the worker consumes; settles imports
            stepq_turn(client, 3, timeout=120)
            for round_no in range(1, args.repeat + 1):
                got: dict[str, list[tuple[float, float | None, float]]] = {"bare": [], "stepq": []}
                for _ in range(args.turns):
                    got["bare"].append(measured(lambda: bare_chain(client, n, args.timeout), cpu))
                for _ in range(args.turns):
                    got["stepq"].append(measured(lambda: stepq_turn(client, n, args.timeout), cpu))
                for side, runs in got.items():
                    walls[side] += [w for w, _, _ in runs]
                    cpus[side] += [c for _, c, _ in runs]
                client_cpu.extend(own if cpu else None for _, _, own in got["stepq"])  # thread: shared process
                b_ms = median([w for w, _, _ in got["bare"]]) * 1000 / n
                a_ms = median([w for w, _, _ in got["stepq"]]) * 1000 / n
                rows.append(
                    [
                        str(round_no),
                        f"{b_ms:.3f}",
                        f"{a_ms:.3f}",
                        f"{a_ms / b_ms:.2f}x",
                        fmt_cpu([c for _, c, _ in got["bare"]], n),
                        fmt_cpu([c for _, c, _ in got["stepq"]], n),
                        fmt_cpu(client_cpu[-args.turns :], n),
                    ]
                )
                print(f"round {round_no}: bare {b_ms:.3f} ms/hop, stepq {a_ms:.3f} ms/step", flush=True)
        bare_ms = median(walls["bare"]) * 1000 / n
        stepq_ms = median(walls["stepq"]) * 1000 / n
        ratio = stepq_ms / bare_ms
        summary = [f"{bare_ms:.3f}", f"{stepq_ms:.3f}", f"{ratio:.2f}x"]
        rows.append(["median", *summary, fmt_cpu(cpus["bare"], n), fmt_cpu(cpus["stepq"], n), fmt_cpu(client_cpu, n)])
        print()
        headers = [
            "round",
            "bare ms/hop",
            "stepq ms/step",
            "stepq/bare",
            "bare cpu ms",
            "stepq cpu ms",
            "client cpu ms",
        ]
        print(table(headers, rows))
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        n_runs = len(walls["bare"])
        print(f"\nstepq step overhead: {ratio:.2f}x the bare Celery hop (wall clock; medians of {n_runs} runs of {n}")
        print(f"per side); target <= {TARGET_RATIO:.0f}x: {verdict}.")
        print("cpu ms: the worker process's CPU per hop/step; client cpu ms: this process's (submit + Client.wait).")
        if args.profile:
            print(profile_report(args.profile))
        return 0 if ratio <= TARGET_RATIO else 1
    finally:
        print(f"cleaned up {cleanup(args.redis_url, prefix)} keys under {prefix}")


if __name__ == "__main__":
    sys.exit(main())
