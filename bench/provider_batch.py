"""Provider batch APIs vs online steps: cost and worker-seconds held per enrichment item.

N enrichment items (`benchpb.enrich`: one step, no tools, on the scripted model with simulated model
latency and fixed token counts) run twice, each through a fresh `celery worker` subprocess (threads
pool, the same concurrency) on the real Redis, side by side:

- **online**: `priority="batch"` turns; each step streams from the scripted model, holding its worker
  thread for the model's latency (`--latency-s`, spread over the text's deltas).
- **provider batch**: the same turns with `provider_batch=True`; each step parks its request, this
  process sends the `stepq.provider_batch_tick` task every `--tick-s` (what beat does on the workers),
  the tick sends the parked requests in one scripted provider batch and brings the answers back.

Cost is each turn's stored cost at `STEPQ_PRICES` (the price table below; `batch_factor` 0.5, the
discount Anthropic, Gemini and Bedrock give); worker-seconds held are measured, the sum of every task's
runtime on the worker (Celery's task_prerun -> task_postrun, per task id, `bench.provider_batch_worker`),
ticks included; the worker process's CPU seconds are printed beside them.

    .venv/bin/python -m bench.provider_batch [--items 1000] [--latency-s 0.5] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

from bench._common import (
    DEFAULT_REDIS_URL,
    ROOT,
    bench_settings,
    cleanup,
    positive_count,
    process_cpu_seconds,
    settings_env,
    stop_process,
    unique_prefix,
)
from bench.provider_batch_worker import held_key
from stepq.config.settings import Prices, Settings
from stepq.fleet.protocol import PROVIDER_BATCH_TICK, queue_for, worker_queues
from stepq.models import TurnStatus
from stepq.producer.client import Client

AGENT = "benchpb.enrich"
MODEL = "scripted/bench-sonnet"
# $/Mtok of a Sonnet-class model; batch_factor: the provider batch APIs' 50% discount
PRICES = {MODEL: Prices(input_per_mtok=3.0, output_per_mtok=15.0, batch_factor=0.5)}


@dataclass
class Run:
    mode: str
    items: int
    wall_s: float
    worker_s: float
    worker_cpu_s: float
    cost: float
    by_task: dict[str, float]
    counts: dict[str, int]

    @property
    def worker_s_per_item(self) -> float:
        return self.worker_s / self.items


@contextmanager
def worker(settings: Settings, concurrency: int, latency_s: float) -> Iterator[Callable[[], float]]:
    """`celery worker` (threads pool) in a subprocess: the benchmark's client does not share its GIL."""
    env = settings_env(settings)
    env["BENCH_PB_LATENCY_S"] = str(latency_s)
    cmd = [
        sys.executable, "-m", "celery", "-A", "bench.provider_batch_worker", "worker",
        "--pool=threads", f"--concurrency={concurrency}", "--loglevel=ERROR", "-Q", ",".join(worker_queues(settings)),
        "--without-gossip", "--without-mingle", "--without-heartbeat", f"--hostname={settings.key_prefix}@%h",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield lambda: process_cpu_seconds(proc.pid)
    finally:
        stop_process(proc)


def run(mode: str, items: int, concurrency: int, tick_s: float, latency_s: float, redis_url: str) -> Run:
    prefix = unique_prefix(f"pb-{mode}")
    settings = bench_settings(
        redis_url,
        prefix,
        agent_modules=["bench.agents_provider_batch"],
        prices=PRICES,
        provider_batch_window_s=tick_s,
        provider_batch_max_size=items,
        provider_batch_poll_s=tick_s,
    )
    stop = threading.Event()
    try:
        with worker(settings, concurrency, latency_s) as cpu, Client(settings) as client:
            started, cpu_before = time.perf_counter(), cpu()
            if mode == "batch":  # beat's job on a real fleet: send the tick every poll interval
                ticker = threading.Thread(target=_tick_every, args=(client, settings, tick_s, stop), daemon=True)
                ticker.start()
            handles = [
                client.submit(AGENT, prompt=f"enrich record {i}", priority="batch", provider_batch=(mode == "batch"))
                for i in range(items)
            ]
            results = [h.wait(timeout=1800) for h in handles]
            wall, worker_cpu = time.perf_counter() - started, cpu() - cpu_before
            stop.set()
            raw = cast(dict[str, str], client.runtime.redis.hgetall(held_key(settings)))
        bad = [r for r in results if r.status != TurnStatus.COMPLETED or r.text != "enriched"]
        if bad:
            raise SystemExit(f"{mode}: {len(bad)} items did not complete as expected, e.g. {bad[0].error}")
        batched = sum(all(s.batch for s in r.trace.steps) for r in results)
        if batched != (items if mode == "batch" else 0):
            raise SystemExit(f"{mode}: {batched} of {items} items were answered by a provider batch")
        cost = sum(r.cost or 0.0 for r in results)
        held = {k: float(v) for k, v in raw.items() if not k.endswith(":count")}
        counts = {k.removesuffix(":count"): int(v) for k, v in raw.items() if k.endswith(":count")}
        return Run(mode, items, wall, sum(held.values()), worker_cpu, cost, held, counts)
    finally:
        stop.set()
        cleanup(redis_url, prefix)


def _tick_every(client: Client, settings: Settings, tick_s: float, stop: threading.Event) -> None:
    while not stop.wait(tick_s):
        client.celery.send_task(PROVIDER_BATCH_TICK, queue=queue_for(settings, "batch"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.provider_batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=positive_count, default=1000)
    parser.add_argument("--latency-s", type=float, default=0.5, help="simulated model latency of an online call")
    parser.add_argument("--concurrency", type=positive_count, default=64, help="worker threads")
    parser.add_argument("--batch-concurrency", type=positive_count, default=None,
                        help="worker threads of the provider-batch run (default: --concurrency)")  # fmt: skip
    parser.add_argument("--tick-s", type=float, default=0.5, help="the provider-batch tick's period (beat's)")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args(argv)
    print(f"{args.items} enrichment items of {AGENT} ({MODEL}: 1,200 in / 300 out tokens, "
          f"{args.latency_s:g} s simulated latency online), worker threads: online {args.concurrency}, "
          f"provider batch {args.batch_concurrency or args.concurrency}", flush=True)  # fmt: skip
    online = run("online", args.items, args.concurrency, args.tick_s, args.latency_s, args.redis_url)
    batch_c = args.batch_concurrency or args.concurrency
    batch = run("batch", args.items, batch_c, args.tick_s, args.latency_s, args.redis_url)
    print(
        f"{'mode':<10}{'wall s':>8}{'cost $':>10}{'$/item':>11}{'worker-s':>10}{'worker-ms/item':>16}{'cpu-ms/item':>13}"
    )
    for r in (online, batch):
        print(f"{r.mode:<10}{r.wall_s:>8.1f}{r.cost:>10.4f}{r.cost / r.items:>11.6f}{r.worker_s:>10.2f}"
              f"{r.worker_s_per_item * 1000:>16.2f}{r.worker_cpu_s / r.items * 1000:>13.2f}")  # fmt: skip
    cost_ratio = batch.cost / online.cost
    held_ratio = batch.worker_s / online.worker_s
    print(f"provider batch / online: cost {cost_ratio:.3f}x (goal <= 0.55x), "
          f"worker time held per item {held_ratio:.3f}x (goal <= 0.2x)")  # fmt: skip
    for r in (online, batch):
        tasks = ", ".join(f"{k} {r.counts[k]}x {v:.2f}s" for k, v in sorted(r.by_task.items()))
        print(f"{r.mode} worker-seconds by task: {tasks}")
    return 0 if cost_ratio <= 0.55 and held_ratio <= 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
