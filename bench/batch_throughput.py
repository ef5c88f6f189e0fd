"""Batch throughput: items/s through `stepq batch` on one worker process vs a plain engine loop.

(a) stepq: a JSONL file of N items run by `stepq.producer.batch.BatchRunner` (the body of `stepq batch`:
    submit at most --inflight turns at a time on the batch queue, follow the batch's done stream,
    write one result line per item) against ONE `celery -A stepq.workers.celery_app worker` subprocess
    (threads pool, concurrency C; what `stepq worker --no-beat` runs).
(c) driver: the same file through `stepq batch submit` + `stepq batch wait --output` minus argument
    parsing: the items stored in Redis, the workers' batch driver keeps --inflight turns in flight (a
    finishing turn's worker submits the next item), results collected in Redis and written at the end.
    Runs against the same worker process as (a), right after it.
(b) plain loop: the same file in one process, no broker: `create_turn` + `StepRunner(rt).deliver`
    for each item, then the same result line. Same Redis, same engine, same agent.

The agent (`benchb.extract`) is an object-mode agent on the zero-latency scripted model, so one item
is one step + validating the object. Prints items/s for each side and stepq / plain loop.

    .venv/bin/python -m bench.batch_throughput --items 2000 --concurrency 1 8
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._common import (
    DEFAULT_REDIS_URL,
    ROOT,
    add_thread_counts,
    bench_settings,
    cleanup,
    median,
    now,
    positive_count,
    process_tree_cpu_seconds,
    settings_env,
    stop_process,
    table,
    unique_prefix,
)
from bench.agents_batch import EXTRACTED
from stepq.batches import driver as batch_driver
from stepq.batches.items import item_idempotency_key, result_line
from stepq.config.settings import Settings
from stepq.engine.runner import StepRunner
from stepq.fleet.protocol import BATCH_DRIVE, queue_for, worker_queues
from stepq.fleet.runtime import Runtime
from stepq.models import TurnStatus
from stepq.producer.batch import BatchRunner, read_input, read_items, write_results
from stepq.producer.client import Client
from stepq.turns.submit import create_turn

AGENT = "benchb.extract"
AGENT_MODULES = ["bench.agents_batch"]
WARMUP_ITEMS = 20


def batch_bench_settings(redis_url: str, prefix: str) -> Settings:
    """The run's settings: its own prefix and queues, the batch agents, no /metrics port (several runs share a host)."""
    return bench_settings(redis_url, prefix, agent_modules=AGENT_MODULES, metrics_port=0, beat=False)


@contextlib.contextmanager
def worker_process(settings: Settings, concurrency: int, pool: str = "threads") -> Iterator[Callable[[], float]]:
    """One `celery -A stepq.workers.celery_app worker` subprocess (threads pool, or prefork: that many child
    processes) serving the interactive then batch queue.

    The argv is what `stepq worker --no-beat [--pool prefork]` runs. Yields a function returning the CPU
    seconds of the process and its children.
    """
    cmd = [
        sys.executable, "-m", "celery", "-A", "stepq.workers.celery_app", "worker",
        f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=WARNING",
        "-Q", ",".join(worker_queues(settings)), f"--hostname={settings.key_prefix}-c{concurrency}@%h",
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile(prefix=f"{settings.key_prefix}-worker-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, env=settings_env(settings), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield lambda: process_tree_cpu_seconds(proc.pid)
        except BaseException:
            print(f"worker stderr is in {log.name}", file=sys.stderr)
            raise
        finally:
            stop_process(proc)
    if proc.returncode not in (0, -15):
        print(f"worker exited with {proc.returncode}; its stderr is in {log.name}", file=sys.stderr)
    else:
        Path(log.name).unlink(missing_ok=True)


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Interrupt the main thread if the block outlives `seconds` (e.g. a worker died): no silent hang."""
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.daemon = True
    timer.start()
    try:
        yield
    except KeyboardInterrupt:
        if not timer.is_alive():
            raise TimeoutError(f"{what} did not finish in {seconds:.0f}s") from None
        raise
    finally:
        timer.cancel()


def write_items(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            item = {"key": f"item-{i:06d}", "input": {"text": f"Ada Lovelace <ada{i}@example.com>"}}
            out.write(json.dumps(item) + "\n")


def check_output(path: Path, n: int) -> None:
    """Every item is in the results exactly once, completed, with the validated object."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    keys = {r["key"] for r in rows}
    bad = [r for r in rows if r["status"] != "completed" or r["object"] != EXTRACTED]
    if len(rows) != n or len(keys) != n or bad:
        detail = f"; first bad: {bad[0]}" if bad else ""
        raise RuntimeError(f"{path}: {len(rows)} rows, {len(keys)} distinct keys, {len(bad)} bad (want {n}){detail}")


@dataclass
class Sample:
    side: str
    items: int
    wall_s: float
    worker_cpu_s: float  # the worker process (0 for the plain loop)
    own_cpu_s: float  # this process: BatchRunner for stepq, everything for the plain loop

    @property
    def rate(self) -> float:
        return self.items / self.wall_s

    def cpu_ms(self, which: str = "total") -> float:
        seconds = {"worker": self.worker_cpu_s, "own": self.own_cpu_s}.get(which, self.worker_cpu_s + self.own_cpu_s)
        return seconds * 1000 / self.items


def run_stepq(client: Client, items_path: Path, out_path: Path, inflight: int) -> tuple[float, float]:
    """`stepq batch` minus argument parsing: read the file, BatchRunner.run, results written. (wall s, own cpu s)"""
    batch_id = f"bench-{uuid.uuid4().hex[:12]}"
    started, own = now(), time.process_time()
    items = list(read_items(items_path))
    with out_path.open("w", encoding="utf-8") as out:
        progress = BatchRunner(client, AGENT, batch_id, out, inflight).run(items, {})
    wall, cpu = now() - started, time.process_time() - own
    if progress.failed or progress.done != len(items):
        raise RuntimeError(f"batch {batch_id}: {progress.done} done, {progress.failed} failed of {len(items)}")
    return wall, cpu


def run_driver(client: Client, items_path: Path, out_path: Path, inflight: int) -> tuple[float, float]:
    """`stepq batch submit` + `stepq batch wait --output` minus argument parsing. (wall s, own cpu s)"""
    rt = client.runtime
    batch_id = f"benchd-{uuid.uuid4().hex[:12]}"
    started, own = now(), time.process_time()
    items = read_input(items_path)
    batch_driver.store_batch(rt, batch_id, AGENT, items, inflight)
    client.celery.send_task(BATCH_DRIVE, args=[batch_id], queue=queue_for(client.settings, "batch"))
    cursor = "$"
    while rt.redis.hget(rt.keys.batch(batch_id), "state") != "finished":
        reply = rt.redis.xread({rt.keys.batch_done(batch_id): cursor}, count=1000, block=500)
        for _, entries in reply or []:
            cursor = entries[-1][0]
    write_results(client, batch_id, out_path)
    wall, cpu = now() - started, time.process_time() - own
    status = batch_driver.status(rt, batch_id)
    if status["failed"] or status["done"] != len(items):
        raise RuntimeError(f"batch {batch_id}: {status['done']} done, {status['failed']} failed of {len(items)}")
    return wall, cpu


def run_plain(rt: Runtime, items_path: Path, out_path: Path) -> tuple[float, float]:
    """The same items through the engine directly: create the turn, deliver its steps in this process, write results."""
    batch_id = f"plain-{uuid.uuid4().hex[:12]}"
    runner = StepRunner(rt)
    started, own = now(), time.process_time()
    with out_path.open("w", encoding="utf-8") as out:
        for key, item, error in read_items(items_path):
            if item is None:
                raise RuntimeError(f"bad item {key}: {error}")
            state, _ = create_turn(
                rt,
                AGENT,
                prompt=item.prompt_text(),
                messages=item.messages,
                idempotency_key=item_idempotency_key(batch_id, item),
                metadata={**item.metadata, "batch_id": batch_id, "item_key": key},
                priority="batch",
            )
            step = 0
            while (decision := runner.deliver(state.turn_id, step)).action == "next":
                step = decision.step
            final = rt.turns.load(state.turn_id)
            if decision.action != "none" or final is None or final.status != TurnStatus.COMPLETED:
                raise RuntimeError(f"item {key}: delivery ended {decision}, turn {final and final.status}")
            out.write(json.dumps(result_line(key, final), ensure_ascii=False) + "\n")
            out.flush()
    return now() - started, time.process_time() - own


def measure_stepq(
    settings: Settings, concurrency: int, workdir: Path, n: int, inflight: int, timeout: float, pool: str = "threads"
) -> list[Sample]:
    """The in-process BatchRunner, then the workers' batch driver, against the same worker process."""
    client = Client(settings)
    warm, items = workdir / "warm.jsonl", workdir / "items.jsonl"
    samples = []
    with worker_process(settings, concurrency, pool) as worker_cpu:
        with deadline(120, "warm-up batch (is the worker running?)"):
            run_stepq(client, warm, workdir / "warm-out.jsonl", inflight)  # also proves the worker consumes
            run_driver(client, warm, workdir / "warm-out.jsonl", inflight)
        for side, run in (("stepq", run_stepq), ("driver", run_driver)):
            out = workdir / f"out-{side}-c{concurrency}.jsonl"
            before = worker_cpu()
            with deadline(timeout, f"{side} batch of {n} at concurrency {concurrency}"):
                wall, own_cpu = run(client, items, out, inflight)
            worker = worker_cpu() - before
            check_output(out, n)
            label = f"{side} C={concurrency}" + (f" {pool}" if pool != "threads" else "")
            samples.append(Sample(label, n, wall, worker, own_cpu))
    return samples


def measure_plain(settings: Settings, workdir: Path, n: int, timeout: float) -> Sample:
    from stepq.fleet.runtime import get_runtime

    rt = get_runtime(settings)
    out = workdir / "out-plain.jsonl"
    run_plain(rt, workdir / "warm.jsonl", workdir / "warm-out.jsonl")
    with deadline(timeout, f"plain loop of {n}"):
        wall, cpu = run_plain(rt, workdir / "items.jsonl", out)
    check_output(out, n)
    return Sample("plain loop", n, wall, 0.0, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=positive_count, default=2000, help="items per batch (default 2000)")
    add_thread_counts(parser)
    parser.add_argument(
        "--inflight", type=positive_count, default=64, help="BatchRunner turns in flight (stepq batch default 64)"
    )
    parser.add_argument(
        "--repeat", type=positive_count, default=1, help="rounds of plain loop + each concurrency (default 1)"
    )
    parser.add_argument(
        "--pool", choices=["threads", "prefork"], default="threads",
        help="the worker's pool (default threads, as `stepq worker`); prefork: C single-threaded child processes",
    )  # fmt: skip
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--timeout", type=float, default=600.0, help="per measured batch, seconds")
    args = parser.parse_args(argv)

    prefix = unique_prefix("batch")
    settings = batch_bench_settings(args.redis_url, prefix)
    print(
        f"run {prefix}: {args.items} items of {AGENT} (object mode, zero-latency scripted model), "
        f"worker {args.pool} pool, concurrency {args.concurrency}, inflight {args.inflight}, repeat {args.repeat}",
        flush=True,
    )
    samples: dict[str, list[Sample]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as tmp:
            workdir = Path(tmp)
            write_items(workdir / "items.jsonl", args.items)
            write_items(workdir / "warm.jsonl", WARMUP_ITEMS)
            for round_no in range(1, args.repeat + 1):
                for c in [None, *args.concurrency]:  # None: the plain loop
                    if c is None:
                        got = [measure_plain(settings, workdir, args.items, args.timeout)]
                    else:
                        got = measure_stepq(settings, c, workdir, args.items, args.inflight, args.timeout, args.pool)
                    for sample in got:
                        samples.setdefault(sample.side, []).append(sample)
                        print(
                            f"round {round_no}: {sample.side:<14} {sample.rate:8.1f} items/s "
                            f"({sample.wall_s:.2f}s, cpu {sample.cpu_ms():.2f} ms/item)",
                            flush=True,
                        )
        plain_rate = median([s.rate for s in samples["plain loop"]])
        rows = []
        for side, got in samples.items():
            rate = median([s.rate for s in got])
            cpu = [f"{median([s.cpu_ms(which) for s in got]):.2f}" for which in ("total", "worker", "own")]
            rows.append([side, str(args.items), f"{rate:.1f}", f"{1000 / rate:.2f}", *cpu, f"{rate / plain_rate:.2f}x"])
        print()
        headers = ["side", "items", "items/s", "ms/item", "cpu ms/item", "worker cpu", "client cpu", "vs plain"]
        print(table(headers, rows))
        print(
            "\nitems/s: wall clock from reading the input file to the last result line (median of rounds)."
            "\ncpu ms/item: worker process + this process (client cpu: BatchRunner for stepq, the waiting"
            "\nclient for driver, the whole loop for the plain loop). Neither includes the Redis server's CPU."
            "\nvs plain = items/s / plain-loop items/s."
        )
        return 0
    finally:
        print(f"cleaned up {cleanup(args.redis_url, prefix)} keys under {prefix}")


if __name__ == "__main__":
    sys.exit(main())
