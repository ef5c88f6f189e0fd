"""The benchmark worker's Celery app: stepq's app plus a no-op task (the stepq-configured Celery hop) and the
stage clocks' control task (bench/stages.py: the measured CPU breakdown by engine stage).

`celery -A bench.celery_app worker` builds it from `STEPQ_*` settings; the in-process
worker calls `build_app(settings)`. The tasks share one app, broker config and worker. The plain Celery
hop, without any of stepq's configuration, is in bench/plain_celery.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from bench import stages, timeline
from stepq.config.settings import Settings, get_settings
from stepq.store.connection import get_redis
from stepq.workers.app import create_app

NOOP = "stepq.bench.noop"


def done_key(settings: Settings, run_id: str) -> str:
    return f"{settings.key_prefix}:bench:done:{run_id}"


def build_app(settings: Settings) -> Celery:
    stages.install()  # off until the benchmark resets the clocks: one flag check per stage call meanwhile
    app = create_app(settings)

    @app.task(name=NOOP, acks_late=True, reject_on_worker_lost=True)
    def noop(run_id: str, remaining: int) -> None:
        """Re-enqueue itself, like run_step enqueues the next step; the last one says it is done."""
        if remaining > 1:
            app.send_task(NOOP, args=[run_id, remaining - 1], queue=settings.queue)
        else:
            get_redis(settings).rpush(done_key(settings, run_id), "done")

    @app.task(name=stages.CONTROL_TASK)
    def stage_clocks(request_id: str, command: str) -> None:
        """Reset or read the stage clocks of this worker process; the answer goes to a Redis list."""
        answer = json.dumps(stages.control(command))
        get_redis(settings).rpush(stages.reply_key(settings.key_prefix, request_id), answer)

    profile_path = os.environ.get("STEPQ_BENCH_PROFILE")
    if profile_path:
        _profile_tasks(profile_path)
    end_path = os.environ.get("STEPQ_BENCH_PROFILE_END")
    if end_path:
        _profile_step_ends(end_path)
    timeline_path = os.environ.get("STEPQ_BENCH_TIMELINE")
    if timeline_path:
        timeline.install(timeline_path)
    return app


_PROFILE: Any = None


def _profile_tasks(path: str) -> None:
    """cProfile every task body (one pool thread at concurrency 1) on the thread's CPU clock, so the times are
    CPU, not waits on Redis or other threads; the stats are dumped at shutdown."""
    global _PROFILE
    import cProfile
    import time

    from celery.signals import task_postrun, task_prerun, worker_shutdown

    profile = _PROFILE = cProfile.Profile(time.thread_time)
    task_prerun.connect(lambda **_: profile.enable(), weak=False)
    task_postrun.connect(lambda **_: profile.disable(), weak=False)
    worker_shutdown.connect(lambda **_: profile.dump_stats(path), weak=False)


def _profile_step_ends(path: str) -> None:
    """cProfile each streamed step's end on its thread's CPU clock: from its stream's last byte (the provider
    loop's pump returns) to its task's end (Celery's trace and ack included). Where the steps of a burst that
    end together spend their CPU; threads pool only (the pumped read). The merged stats are dumped at shutdown."""
    import cProfile
    import pstats
    import threading
    import time

    import celery.concurrency.thread as thread_pool
    from celery.signals import worker_shutdown

    from stepq.providers.loop_transport import LoopBody

    profiles: list[cProfile.Profile] = []
    running = threading.local()
    pump, apply_target = LoopBody.pump, thread_pool.apply_target

    def pumped(self: LoopBody, feed: Any, end: Any) -> bool:
        done = pump(self, feed, end)
        running.profile = cProfile.Profile(time.thread_time)
        running.profile.enable()
        return done

    def applied(*args: Any, **kwargs: Any) -> Any:
        try:
            return apply_target(*args, **kwargs)
        finally:
            profile = getattr(running, "profile", None)
            if profile is not None:
                profile.disable()
                profiles.append(profile)
                running.profile = None

    def dump(**_: Any) -> None:
        if profiles:
            stats = pstats.Stats(profiles[0])
            for profile in profiles[1:]:
                stats.add(profile)
            stats.dump_stats(path)

    LoopBody.pump = pumped  # type: ignore[method-assign]
    thread_pool.apply_target = applied
    worker_shutdown.connect(dump, weak=False)


def dump_profile(path: str) -> None:
    """For the in-process worker, which is stopped without a worker_shutdown signal."""
    if _PROFILE is not None:
        _PROFILE.dump_stats(path)


def __getattr__(name: str) -> Any:
    """`app` is built on first access, so importing this module for `build_app` has no side effects."""
    if name == "app":
        value = build_app(get_settings())
        globals()["app"] = value
        return value
    raise AttributeError(name)
