"""Chat time-to-first-chunk with and without a big batch queued, on one worker serving both queues.

A batch of --batch-items turns (`benchb.batch_item`, one short step each) is submitted with
`Client.submit_batch` before the worker starts, so the batch queue holds all of it. Then ONE
`celery -A stepq.workers.celery_app worker` subprocess (threads pool, concurrency C, queues
`<queue>,<queue>.batch`: interactive first) starts draining it, and --chats chat turns
(`benchb.chat`, several text deltas) run one after another:

- with batch: while the batch queue still holds thousands of items (its depth is printed at the
  start and end of the measurement);
- without batch: after the rest of the batch queue is purged and the worker has gone idle.

TTFC = from `Client.submit` to the first `text-delta` event received through `Client.events`
(a subscriber on the turn's stream). Also shown: queue wait, from the turn's creation to a worker
starting its first step. Reported per worker concurrency: p50/p95/max and with/without ratios.

    .venv/bin/python -m bench.chat_under_batch --chats 20 --batch-items 5000 --concurrency 1 8
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from bench._common import (
    DEFAULT_REDIS_URL,
    add_thread_counts,
    cleanup,
    now,
    percentile,
    positive_count,
    table,
    unique_prefix,
)
from bench.agents_batch import CHAT_TEXT
from bench.batch_throughput import batch_bench_settings, deadline, worker_process
from stepq.config.settings import Settings
from stepq.fleet.protocol import queue_for
from stepq.models import EventType, TurnStatus
from stepq.producer.client import Client
from stepq.store.keys import Keys

CHAT_AGENT = "benchb.chat"
BATCH_AGENT = "benchb.batch_item"
WARMUP_CHATS = 3
MIN_BACKLOG = 1000  # fewer items left queued at the end of the "with" phase makes the run inconclusive


class Inconclusive(Exception):
    """The worker drained the batch backlog during the chats: there was nothing to measure against."""


@dataclass
class Chat:
    ttfc_s: float
    queue_wait_s: float  # turn created -> a worker started its first step


def batch_queue_key(settings: Settings) -> str:
    """The Redis list behind the batch queue (messages are sent without a priority, so only the first list)."""
    return Keys.broker_queue_lists(Keys(settings.key_prefix).broker_prefix, queue_for(settings, "batch"))[0]


def batch_depth(client: Client) -> int:
    return int(client.runtime.redis.llen(batch_queue_key(client.settings)))


def batch_finished(client: Client, batch_id: str) -> int:
    raw = client.runtime.redis.hmget(client.runtime.keys.batch(batch_id), ["done", "failed"])
    return sum(int(v or 0) for v in raw)


def chat_turn(client: Client, n: int) -> Chat:
    """One chat turn: submit, follow its events to the first text delta, then wait for the end."""
    started = now()
    handle = client.submit(CHAT_AGENT, prompt=f"Where is my order? ({n})")
    ttfc = None
    for event in handle.events(idle_timeout=120):
        if event.type == EventType.TEXT_DELTA:
            ttfc = now() - started
            break
    if ttfc is None:
        raise RuntimeError(f"chat turn {handle.turn_id} ended without a text delta")
    result = handle.wait(timeout=120)
    if result.status != TurnStatus.COMPLETED or result.text != CHAT_TEXT:
        raise RuntimeError(f"chat turn {handle.turn_id} ended {result.status}: {result.error}")
    state = handle.get()
    return Chat(ttfc, (state.started_at or state.created_at) - state.created_at)


def chats(client: Client, count: int) -> list[Chat]:
    return [chat_turn(client, i) for i in range(count)]


def wait_idle(client: Client, batch_id: str, quiet_s: float = 1.0, timeout: float = 60.0) -> None:
    """After a purge: wait until no batch item has finished for `quiet_s` (the worker's in-flight ones are done)."""
    end = time.monotonic() + timeout
    last, since = batch_finished(client, batch_id), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > end:
            raise TimeoutError("the worker kept finishing batch items after the purge")
        time.sleep(0.1)
        current = batch_finished(client, batch_id)
        if current != last:
            last, since = current, time.monotonic()


def fmt_ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.1f}"


def run_config(settings: Settings, concurrency: int, n_chats: int, n_batch: int) -> dict[str, list[Chat]]:
    client = Client(settings)
    batch_id = f"bench-c{concurrency}"
    items = [{"key": f"item-{i:06d}", "prompt": f"item {i}"} for i in range(n_batch)]
    started = now()
    client.submit_batch(BATCH_AGENT, items, key=batch_id)
    elapsed = now() - started
    depth = batch_depth(client)
    print(f"C={concurrency}: submitted {n_batch} batch items in {elapsed:.1f}s; batch queue depth {depth}", flush=True)
    if depth != n_batch:
        raise RuntimeError(f"expected {n_batch} messages in {batch_queue_key(settings)}, found {depth}")
    got: dict[str, list[Chat]] = {}
    with worker_process(settings, concurrency):
        with deadline(120, "warm-up chat turns (is the worker running?)"):
            chats(client, WARMUP_CHATS)
        depth_start, done_start, t0 = batch_depth(client), batch_finished(client, batch_id), now()
        with deadline(300, "chat turns with the batch queued"):
            got["with batch"] = chats(client, n_chats)
        depth_end, done_end, t1 = batch_depth(client), batch_finished(client, batch_id), now()
        rate = (done_end - done_start) / (t1 - t0)
        print(
            f"C={concurrency}: with batch: queue depth {depth_start} at start, {depth_end} at end; "
            f"the worker finished {done_end - done_start} batch items meanwhile ({rate:.0f}/s)",
            flush=True,
        )
        if depth_end < MIN_BACKLOG:
            raise Inconclusive(f"only {depth_end} batch items left queued: raise --batch-items for a real backlog")
        purged = int(client.runtime.redis.delete(batch_queue_key(settings)))
        wait_idle(client, batch_id)
        depth_without = batch_depth(client)
        with deadline(300, "chat turns without a batch"):
            got["without batch"] = chats(client, n_chats)
        print(
            f"C={concurrency}: without batch: purged the batch queue ({purged} key), worker idle, "
            f"queue depth {depth_without} at start, {batch_depth(client)} at end",
            flush=True,
        )
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--chats", type=positive_count, default=20, help="measured chat turns per condition (default 20)"
    )
    parser.add_argument("--batch-items", type=positive_count, default=5000, help="batch items queued (default 5000)")
    add_thread_counts(parser)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args(argv)
    if args.batch_items <= MIN_BACKLOG:
        parser.error(f"--batch-items must be more than {MIN_BACKLOG}: the chats must still find a backlog at their end")

    prefix = unique_prefix("chatb")
    settings = batch_bench_settings(args.redis_url, prefix)
    print(
        f"run {prefix}: {args.chats} chat turns ({CHAT_AGENT}) with and without {args.batch_items} queued items of "
        f"{BATCH_AGENT}; one worker, concurrency {args.concurrency}",
        flush=True,
    )
    rows = []
    try:
        for concurrency in args.concurrency:
            try:
                got = run_config(settings, concurrency, args.chats, args.batch_items)
            except Inconclusive as exc:
                print(f"inconclusive at C={concurrency}: {exc}", file=sys.stderr)
                return 1
            base = got["without batch"]
            for condition in ("without batch", "with batch"):
                ttfc = [c.ttfc_s for c in got[condition]]
                wait = [c.queue_wait_s for c in got[condition]]
                base_ttfc = [c.ttfc_s for c in base]
                rows.append(
                    [
                        str(concurrency),
                        condition,
                        str(len(ttfc)),
                        fmt_ms(ttfc, 50),
                        fmt_ms(ttfc, 95),
                        fmt_ms(ttfc, 100),
                        fmt_ms(wait, 50),
                        fmt_ms(wait, 95),
                        f"{percentile(ttfc, 50) / percentile(base_ttfc, 50):.2f}x",
                        f"{percentile(ttfc, 95) / percentile(base_ttfc, 95):.2f}x",
                    ]
                )
        print()
        headers = ["C", "condition", "chats", "TTFC p50 ms", "p95 ms", "max ms", "wait p50 ms", "wait p95 ms"]
        print(table([*headers, "p50 vs without", "p95 vs without"], rows))
        print(
            "\nTTFC: Client.submit -> first text-delta received through Client.events. wait: turn created -> a"
            "\nworker started its first step (time.time() stamps of two processes on one host)."
        )
        return 0
    finally:
        print(f"cleaned up {cleanup(args.redis_url, prefix)} keys under {prefix}")


if __name__ == "__main__":
    sys.exit(main())
