"""stepq's per-step overhead against a plain Celery hop, on one broker.

(a) plain Celery: a no-op task that re-enqueues itself N times on a plain app (bench/plain_celery.py:
    Celery's defaults plus `acks_late` and prefetch 1, none of stepq's configuration, signals or
    bootsteps), in its own `celery worker` process; timed from the first enqueue to the Nth execution.
    This is the floor.
(b) stepq-configured Celery: the same no-op chain on stepq's app (`stepq.fleet.protocol.celery_config`,
    stepq's signals and bootsteps) in the stepq worker: a cost added to the worker's Celery setup shows
    up as (b) against (a).
(c) stepq: turns of N steps (zero-latency scripted model + one trivial tool per step) submitted
    with `stepq.Client` and awaited with `Client.wait`; ms/step = total / N. This is the worker a user
    gets: with nothing else waiting, a turn's next step runs in the same task (`STEPQ_INLINE_STEPS`).
(d) stepq, one step per task: the same turns on a second stepq worker with `STEPQ_INLINE_STEPS=false`,
    every step a hop through the broker (what each step costs when the worker is busy with others).

Each worker: threads pool, concurrency 1; the sides alternate per round. Then one more round of turns on
each stepq worker with its stage clocks on (bench/stages.py) prints the worker's CPU per step by stage,
measured. Targets (on (c), the default worker): stepq ms/step <= 1.3x the plain hop's ms/hop, and the
worker's CPU per step <= 1.3x the plain worker's CPU per hop; (d) is shown against the same hop, no target.

    .venv/bin/python -m bench.step_overhead --steps 200 --turns 3 --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench import stages
from bench._common import (
    DEFAULT_REDIS_URL,
    bench_settings,
    cleanup,
    median,
    now,
    output_path_problem,
    positive_count,
    profile_report,
    running_plain_worker,
    running_worker,
    table,
    unique_prefix,
)
from bench.celery_app import NOOP, done_key
from bench.plain_celery import PLAIN_NOOP, build_plain_app, plain_done_key, plain_queue
from stepq.models import FinishReason, TurnStatus
from stepq.producer.client import Client

AGENT = "bench.overhead"
TARGET_RATIO = 1.3  # stepq ms/step against the plain hop's ms/hop (moonshot 1.15)
TARGET_CPU_RATIO = 1.3  # the worker's CPU per step against the plain worker's CPU per hop
SIDES = ("plain", "celery", "stepq", "per-task")
CpuClock = Callable[[], float] | None


def plain_chain(plain: Any, redis: Any, prefix: str, steps: int, timeout: float) -> float:
    """Seconds from the first enqueue of the plain app's no-op chain to its Nth execution."""
    run_id = uuid.uuid4().hex
    key = plain_done_key(prefix, run_id)
    started = now()
    plain.send_task(PLAIN_NOOP, args=[run_id, steps], queue=plain_queue(prefix))
    if redis.blpop([key], timeout=int(timeout)) is None:
        raise TimeoutError(f"plain Celery chain of {steps} did not finish in {timeout}s")
    elapsed = now() - started
    redis.delete(key)
    return elapsed


def bare_chain(client: Client, steps: int, timeout: float) -> float:
    """Seconds from the first enqueue of the stepq-configured no-op chain to its Nth execution."""
    settings = client.settings
    run_id = uuid.uuid4().hex
    key = done_key(settings, run_id)
    redis = client.runtime.redis
    started = now()
    client.celery.send_task(NOOP, args=[run_id, steps], queue=settings.queue)
    if redis.blpop([key], timeout=int(timeout)) is None:
        raise TimeoutError(f"stepq-configured Celery chain of {steps} did not finish in {timeout}s")
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
    parser.add_argument(
        "--steps", type=positive_count, default=200, help="steps per turn = hops per chain (default 200)"
    )
    parser.add_argument("--turns", type=positive_count, default=3, help="turns (and chains) per round (default 3)")
    parser.add_argument("--repeat", type=positive_count, default=3, help="rounds of chains then turns (default 3)")
    parser.add_argument("--worker", choices=["process", "thread"], default="process", help="default: process")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--profile", metavar="PATH", help="cProfile the worker's task bodies; stats to PATH")
    parser.add_argument(
        "--loglevel", default="ERROR", help="the stepq worker's --loglevel (default ERROR; `stepq worker` runs at INFO)"
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 1000:
        parser.error("--steps must be 1..1000 (LoopConfig.max_steps allows at most 1000)")
    problem = output_path_problem("--profile", args.profile)
    if problem:
        parser.error(problem)
    n = args.steps

    prefix = unique_prefix("step")
    settings = bench_settings(args.redis_url, prefix)
    client = Client(settings)
    per_task_settings = bench_settings(args.redis_url, f"{prefix}-hop", inline_steps=False)
    per_task = Client(per_task_settings)
    plain = build_plain_app(args.redis_url, prefix)
    print(
        f"run {prefix}: plain worker (process) + stepq {args.worker} worker + stepq {args.worker} worker with "
        f"STEPQ_INLINE_STEPS=false (--loglevel={args.loglevel}), each threads pool, concurrency 1; "
        f"steps={n}, turns={args.turns}, repeat={args.repeat}",
        flush=True,
    )
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    cpus: dict[str, list[float | None]] = {side: [] for side in SIDES}
    client_cpu: list[float | None] = []
    rows: list[list[str]] = []
    redis = client.runtime.redis
    try:
        with (
            running_plain_worker(args.redis_url, prefix) as plain_cpu,
            running_worker(settings, args.worker, args.profile, args.loglevel) as cpu,
            running_worker(per_task_settings, args.worker, None, args.loglevel) as per_task_cpu,
        ):
            plain_chain(plain, redis, prefix, 5, timeout=120)  # warm-up: proves the workers consume
            bare_chain(client, 5, timeout=120)
            stepq_turn(client, 3, timeout=120)
            stepq_turn(per_task, 3, timeout=120)
            runs: dict[str, Callable[[], float]] = {
                "plain": lambda: plain_chain(plain, redis, prefix, n, args.timeout),
                "celery": lambda: bare_chain(client, n, args.timeout),
                "stepq": lambda: stepq_turn(client, n, args.timeout),
                "per-task": lambda: stepq_turn(per_task, n, args.timeout),
            }
            clocks: dict[str, CpuClock] = {"plain": plain_cpu, "celery": cpu, "stepq": cpu, "per-task": per_task_cpu}
            for round_no in range(1, args.repeat + 1):
                got: dict[str, list[tuple[float, float | None, float]]] = {side: [] for side in SIDES}
                for side in SIDES:
                    for _ in range(args.turns):
                        got[side].append(measured(runs[side], clocks[side]))
                for side, results in got.items():
                    walls[side] += [w for w, _, _ in results]
                    cpus[side] += [c for _, c, _ in results]
                client_cpu.extend(own if cpu else None for _, _, own in got["stepq"])  # thread: shared process
                ms = {side: median([w for w, _, _ in got[side]]) * 1000 / n for side in SIDES}
                rows.append(
                    [
                        str(round_no),
                        *(f"{ms[side]:.3f}" for side in SIDES),
                        f"{ms['stepq'] / ms['plain']:.2f}x",
                        f"{ms['per-task'] / ms['plain']:.2f}x",
                        f"{ms['celery'] / ms['plain']:.2f}x",
                        *(fmt_cpu([c for _, c, _ in got[side]], n) for side in SIDES),
                        fmt_cpu(client_cpu[-args.turns :], n),
                    ]
                )
                print(
                    f"round {round_no}: plain {ms['plain']:.3f} ms/hop, stepq-configured {ms['celery']:.3f} ms/hop, "
                    f"stepq {ms['stepq']:.3f} ms/step, one step per task {ms['per-task']:.3f} ms/step",
                    flush=True,
                )
            # the breakdown rounds: stepq turns again on each stepq worker, with its stage clocks recording
            dumps = {}
            for side, side_client in (("stepq", client), ("per-task", per_task)):
                stages.ask(side_client, "reset")
                for _ in range(args.turns):
                    stepq_turn(side_client, n, args.timeout)
                dumps[side] = stages.ask(side_client, "dump")
        ms = {side: median(walls[side]) * 1000 / n for side in SIDES}
        ratio = ms["stepq"] / ms["plain"]
        rows.append(
            [
                "median",
                *(f"{ms[side]:.3f}" for side in SIDES),
                f"{ratio:.2f}x",
                f"{ms['per-task'] / ms['plain']:.2f}x",
                f"{ms['celery'] / ms['plain']:.2f}x",
                *(fmt_cpu(cpus[side], n) for side in SIDES),
                fmt_cpu(client_cpu, n),
            ]
        )
        print()
        headers = [
            "round",
            "plain ms/hop",
            "stepq-cfg ms/hop",
            "stepq ms/step",
            "per-task ms/step",
            "stepq/plain",
            "per-task/plain",
            "cfg/plain",
            "plain cpu ms",
            "stepq-cfg cpu ms",
            "stepq cpu ms",
            "per-task cpu ms",
            "client cpu ms",
        ]
        print(table(headers, rows))
        plain_cpus = [c for c in cpus["plain"] if c is not None]
        stepq_cpus = [c for c in cpus["stepq"] if c is not None]
        cpu_ratio = median(stepq_cpus) / median(plain_cpus) if plain_cpus and stepq_cpus else None
        wall_ok = ratio <= TARGET_RATIO
        cpu_ok = cpu_ratio is not None and cpu_ratio <= TARGET_CPU_RATIO
        n_runs = len(walls["plain"])
        print(
            f"\nstepq step: {ratio:.2f}x the plain Celery hop in wall clock (medians of {n_runs} runs of {n} per side); "
            f"target <= {TARGET_RATIO}x: {'met' if wall_ok else 'NOT met'}."
        )
        if cpu_ratio is None:
            print("worker CPU: not measured (thread worker: the client shares its process); target: no verdict.")
        else:
            print(
                f"worker CPU per step: {cpu_ratio:.2f}x the plain worker's per hop; "
                f"target <= {TARGET_CPU_RATIO}x: {'met' if cpu_ok else 'NOT met'}."
            )
        per_task_cpus = [c for c in cpus["per-task"] if c is not None]
        per_task_cpu_ratio = f"{median(per_task_cpus) / median(plain_cpus):.2f}x" if per_task_cpus else "-"
        print(
            f"stepq with one step per task (STEPQ_INLINE_STEPS=false): {ms['per-task'] / ms['plain']:.2f}x the plain "
            f"hop in wall clock, {per_task_cpu_ratio} in worker CPU (no target: every step pays a broker hop)."
        )
        print(
            f"stepq-configured Celery hop: {ms['celery'] / ms['plain']:.2f}x the plain hop (what stepq's Celery "
            "configuration, signals and bootsteps cost before any engine work)."
        )
        print("cpu ms: each worker process's CPU per hop/step; client cpu ms: this process's (submit + Client.wait).")
        print()
        print("stepq (the default worker):")
        print(stages.breakdown(dumps["stepq"], args.turns * n, "step"))
        print("\nstepq, one step per task:")
        print(stages.breakdown(dumps["per-task"], args.turns * n, "step"))
        if args.worker == "thread":
            print("(thread worker: the process total includes this benchmark's own client)")
        if args.profile:
            print(profile_report(args.profile))
        return 0 if wall_ok and cpu_ok else 1
    finally:
        cleaned = cleanup(args.redis_url, prefix) + cleanup(args.redis_url, per_task_settings.key_prefix)
        print(f"cleaned up {cleaned} keys under {prefix} and {per_task_settings.key_prefix}")


if __name__ == "__main__":
    sys.exit(main())
