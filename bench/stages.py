"""A measured CPU breakdown of the worker by engine stage: thread CPU time around the stage calls.

The benchmark worker (`bench.celery_app`) wraps the engine's stage functions in place (no product code
changes): each wrapper reads `time.thread_time()` (the calling thread's CPU clock) on entry and exit and
charges the time to its stage, exclusively: while a nested stage runs (the emitter's publish inside the
model call, the commit inside the tools stage), the outer stage's clock is paused. Recording is off until
the benchmark sends `reset` (a task on the worker's queue) and is read back with `dump`; while it is off a
wrapper costs one flag check. What no stage covers (Celery's consumer and ack, lease renewals, the
collector) is the process's CPU over the same window minus the stages' sum: "outside the stages".

Thread CPU is only meaningful on the threads pool: under gevent all greenlets share one thread's clock.
"""

from __future__ import annotations

import functools
import gc
import json
import resource
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

STAGES = (
    "begin",
    "model call / stream parsing",
    "coalescing (emit)",
    "publish (flush + event write)",
    "decide",
    "tools",
    "commit",
    "enqueue next step",
    "rest of the delivery",
)
OUTSIDE = "outside the stages (Celery consumer + ack, lease renewal, gc)"
CONTROL_TASK = "stepq.bench.stages"

_on = False
_lock = threading.Lock()
_threads: list[_ThreadClock] = []
_local = threading.local()
_window: dict[str, float] = {"process_cpu": 0.0, "wall": 0.0}
_installed = False
_gc: dict[str, float] = {"seconds": 0.0, "collections": 0.0}
GC = "of which garbage collection (inside whichever stage triggered it)"


class _ThreadClock:
    __slots__ = ("cpu", "gc_start", "mark", "stack")

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.mark = 0.0
        self.gc_start = 0.0
        self.cpu: defaultdict[str, float] = defaultdict(float)


def _clock() -> _ThreadClock:
    clock: _ThreadClock | None = getattr(_local, "clock", None)
    if clock is None:
        clock = _local.clock = _ThreadClock()
        with _lock:
            _threads.append(clock)
    return clock


def _wrap(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if not _on:
            return fn(*args, **kwargs)
        clock = _clock()
        now = time.thread_time()
        if clock.stack:  # pause the enclosing stage
            clock.cpu[clock.stack[-1]] += now - clock.mark
        clock.stack.append(stage)
        clock.mark = now
        try:
            return fn(*args, **kwargs)
        finally:
            now = time.thread_time()
            clock.cpu[stage] += now - clock.mark
            clock.stack.pop()
            clock.mark = now  # the enclosing stage resumes from here

    timed.__wrapped_stage__ = stage  # type: ignore[attr-defined]
    return timed


def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    """Times each collection on the collecting thread's CPU clock (it is also inside some stage's time)."""
    if not _on:
        return
    clock = _clock()
    if phase == "start":
        clock.gc_start = time.thread_time()
    elif clock.gc_start:
        _gc["seconds"] += time.thread_time() - clock.gc_start
        _gc["collections"] += 1
        clock.gc_start = 0.0


def install() -> None:
    """Wrap the stage functions where their callers look them up (module or class attributes)."""
    global _installed
    if _installed:
        return
    _installed = True
    gc.callbacks.append(_gc_callback)
    from stepq.engine import begin, context, decide, emitter, model_call, runner
    from stepq.providers import loop_transport
    from stepq.store import turns
    from stepq.workers import tasks

    targets: list[tuple[Any, str, str]] = [
        (turns.TurnStore, "begin_step", "begin"),
        (begin, "open_step", "begin"),
        (begin, "start_running", "begin"),
        (begin, "plan_call", "begin"),
        (model_call, "compact", "model call / stream parsing"),
        (model_call, "answer", "model call / stream parsing"),
        (loop_transport.LoopBody, "deliver", "model call / stream parsing"),  # a stream read on the provider loop
        (loop_transport.LoopBody, "finish", "model call / stream parsing"),
        (emitter.StepEmitter, "emit", "coalescing (emit)"),
        (emitter.StepEmitter, "_start_flush_locked", "publish (flush + event write)"),
        (emitter.StepEmitter, "_end_flush_locked", "publish (flush + event write)"),
        (emitter, "flush_due", "publish (flush + event write)"),  # the flush timer's thread
        (decide, "record_answer", "decide"),
        (decide, "retry_malformed", "decide"),
        (decide, "final_answer", "decide"),
        (runner, "run_tools", "tools"),
        (context.Delivery, "commit", "commit"),
        (tasks, "_enqueue_step", "enqueue next step"),
        (tasks, "_deliver", "rest of the delivery"),  # the outermost: lease adopt/release, metrics, ...
    ]
    for owner, name, stage in targets:
        setattr(owner, name, _wrap(stage, getattr(owner, name)))


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def control(command: str) -> dict[str, Any]:
    """`reset`: zero every thread's clocks and start recording; `dump`: stop and return seconds per stage."""
    global _on
    if command == "reset":
        with _lock:
            for clock in _threads:
                clock.cpu = defaultdict(float)
        _window.update(process_cpu=_process_cpu(), wall=time.monotonic())
        _gc.update(seconds=0.0, collections=0.0)
        _on = True
        return {}
    _on = False
    with _lock:
        totals: defaultdict[str, float] = defaultdict(float)
        for clock in _threads:
            for stage, seconds in clock.cpu.items():
                totals[stage] += seconds
    process = _process_cpu() - _window["process_cpu"]
    return {
        "stages": dict(totals),
        "process_cpu": process,
        "wall": time.monotonic() - _window["wall"],
        "gc": dict(_gc),
    }


def reply_key(prefix: str, request_id: str) -> str:
    return f"{prefix}:bench:stages:{request_id}"


def ask(client: Any, command: str, timeout: float = 60.0) -> dict[str, Any]:
    """Send `command` to the benchmark worker's stage clocks (a task on its queue) and wait for the answer."""
    settings = client.settings
    request_id = uuid.uuid4().hex
    client.celery.send_task(CONTROL_TASK, args=[request_id, command], queue=settings.queue)
    got = client.runtime.redis.blpop([reply_key(settings.key_prefix, request_id)], timeout=int(timeout))
    if got is None:
        raise TimeoutError(f"the worker did not answer the stage clocks' {command!r} in {timeout}s")
    answer: dict[str, Any] = json.loads(got[1])
    return answer


def breakdown(dump: dict[str, Any], units: int, unit: str) -> str:
    """The table: per stage, CPU µs per `unit` (step or delta) and its share of the process's CPU."""
    from bench._common import table

    stages: dict[str, float] = dump["stages"]
    process = max(dump["process_cpu"], 1e-9)
    in_stages = sum(stages.values())
    rows = [
        [stage, f"{stages.get(stage, 0.0) * 1e6 / units:.1f}", f"{100 * stages.get(stage, 0.0) / process:.1f}%"]
        for stage in STAGES
    ]
    outside = process - in_stages
    rows.append([OUTSIDE, f"{outside * 1e6 / units:.1f}", f"{100 * outside / process:.1f}%"])
    rows.append(["worker process total (getrusage)", f"{process * 1e6 / units:.1f}", "100.0%"])
    gc_seconds = dump.get("gc", {}).get("seconds", 0.0)
    rows.append([GC, f"{gc_seconds * 1e6 / units:.1f}", f"{100 * gc_seconds / process:.1f}%"])
    head = f"worker CPU by stage, measured (thread CPU time around each stage call), per {unit}, {units} {unit}s"
    return f"{head}:\n" + table(["stage", f"cpu us/{unit}", "share"], rows)
