"""Where a streaming round's time goes, on the clock: the provider loop's lag per delta and each step's end.

The benchmark worker (`bench.celery_app`, with `STEPQ_BENCH_TIMELINE=PATH`) records, in wall-clock time:

- per delta, when the provider loop hands it to the step's emitter and how long after the fake upstream
  wrote it (the fake stamps its write time into each delta's text): the **loop lag**, which grows when the
  loop's thread cannot keep up (the deltas wait in its sockets);
- per timed flush (the flush timer's thread writing staged deltas), when and for how many steps: the
  rounds per 200 ms and steps per round, next to the loop lag;
- per streamed step, when the loop saw its stream end, when the step's thread ran again, and when its
  final commit (which writes `turn-finish`) started and returned.

It writes them as JSON at shutdown; `report` prints one round of them (by its wall-clock window). An opt-in
diagnostic like `--profile-end`: the per-delta wrapper costs a little of the loop thread's CPU itself.
Threads pool only (under gevent there is no provider loop).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

from bench._common import percentile, table
from bench.fake_upstream import STAMP_SEP

BUCKET_S = 0.2  # the loop lag is shown per 200 ms of the round's streaming


def install(path: str) -> None:
    """Wrap the loop's delta hand-off, the body's settle and pump, and the delivery's commit (worker side)."""
    from celery.signals import worker_shutdown

    from stepq.engine import emitter as emitter_module
    from stepq.engine.context import Delivery
    from stepq.engine.emitter import StepEmitter
    from stepq.providers.loop_transport import LoopBody

    lags: list[tuple[float, float]] = []
    ends: list[dict[str, float]] = []
    flushes: list[tuple[float, int]] = []  # each timed flush: when, and how many steps' buffers it took
    running = threading.local()
    stage, settle, pump, commit = StepEmitter._stage, LoopBody._settle, LoopBody.pump, Delivery.commit
    flush_due = emitter_module.flush_due

    def flushed(emitters: list[Any]) -> None:
        flushes.append((time.time(), len(emitters)))
        flush_due(emitters)

    def staged(self: StepEmitter, delta: Any) -> None:
        now = time.time()
        with contextlib.suppress(ValueError):  # a delta the fake did not stamp
            lags.append((now, now - float(delta.text.split(STAMP_SEP, 1)[0])))
        stage(self, delta)

    def settled(self: LoopBody, outcome: Any) -> None:
        if getattr(self, "bench_settled", None) is None:
            self.bench_settled = time.time()  # type: ignore[attr-defined]
        settle(self, outcome)

    def pumped(self: LoopBody, feed: Any, end: Any) -> bool:
        try:
            return pump(self, feed, end)
        finally:
            running.end = {"seen": getattr(self, "bench_settled", 0.0), "resumed": time.time()}

    def committed(self: Delivery, *args: Any, **kwargs: Any) -> Any:
        end = getattr(running, "end", None)
        if end is not None:
            end["commit"] = time.time()
        try:
            return commit(self, *args, **kwargs)
        finally:
            if end is not None:
                end["committed"] = time.time()
                ends.append(end)
                running.end = None

    def dump(**_: Any) -> None:
        with open(path, "w") as out:
            json.dump({"lags": lags, "ends": ends, "flushes": flushes}, out)

    StepEmitter._stage = staged  # type: ignore[method-assign]
    LoopBody._settle = settled  # type: ignore[method-assign]
    LoopBody.pump = pumped  # type: ignore[method-assign]
    Delivery.commit = committed  # type: ignore[method-assign]
    emitter_module.flush_due = flushed
    worker_shutdown.connect(dump, weak=False)


def report(path: str, window: tuple[float, float]) -> str:
    """The loop lag per BUCKET_S and the steps' end segments of the round that ran within `window`."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:  # the worker died before its shutdown wrote the file, or wrote it in part
        return f"(no timeline: {path} could not be read: {type(exc).__name__})"
    start, stop = window
    lags = [(t, lag) for t, lag in data["lags"] if start <= t <= stop]
    ends = [e for e in data["ends"] if e.get("seen") and start <= e["seen"] <= stop]
    if not lags or not ends:
        return "(no timeline recorded for this round)"
    first = lags[0][0]

    def bucket(t: float) -> int:
        return int((t - first) / BUCKET_S)

    buckets: dict[int, list[float]] = {}
    for t, lag in lags:
        buckets.setdefault(bucket(t), []).append(lag * 1000)
    rounds: dict[int, list[int]] = {}
    for t, size in data.get("flushes", []):
        if first <= t <= stop:  # the round's, from its first delta on (first >= start)
            rounds.setdefault(bucket(t), []).append(size)
    rows = []
    for b, v in sorted(buckets.items()):
        sizes = rounds.get(b, [])
        mean_size = f"{sum(sizes) / len(sizes):.1f}" if sizes else "-"
        lag = [f"{percentile(v, 50):.1f}", f"{percentile(v, 99):.1f}"]
        rows.append([f"{b * BUCKET_S:.1f}", str(len(v)), *lag, str(len(sizes)), mean_size])
    out = [
        "provider loop lag (fake's write -> delta handed to the emitter on the loop), per "
        f"{BUCKET_S * 1000:.0f} ms from the round's first delta, and the flush timer's rounds (steps per round):",
        table(["from s", "deltas", "lag p50 ms", "lag p99 ms", "flush rounds", "steps/round"], rows),
    ]
    seen0 = min(e["seen"] for e in ends)

    def ms(values: list[float]) -> list[str]:
        return [f"{percentile(values, q) * 1000:.1f}" for q in (50, 99)] + [f"{max(values) * 1000:.1f}"]

    segments = [
        ["stream end seen on the loop, after the round's first", *ms([e["seen"] - seen0 for e in ends])],
        ["-> the step's thread runs again", *ms([e["resumed"] - e["seen"] for e in ends])],
        ["-> its final commit starts", *ms([e["commit"] - e["resumed"] for e in ends])],
        ["-> the commit (and turn-finish) returns", *ms([e["committed"] - e["commit"] for e in ends])],
    ]
    out += [
        f"\nthe {len(ends)} streamed steps' ends, wall clock:",
        table(["segment", "p50 ms", "p99 ms", "max ms"], segments),
    ]
    return "\n".join(out)
