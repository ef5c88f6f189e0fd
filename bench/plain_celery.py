"""The plain Celery hop: Celery's defaults plus `acks_late` and prefetch 1, and nothing of stepq.

No `stepq.fleet.protocol.celery_config`, no stepq signals, bootsteps or imports: the floor a step is
compared with, so a cost added to the worker's Celery setup (in `bench.celery_app`'s stepq-configured hop)
shows up against it. The one extra setting is the broker's `global_keyprefix`, which only names the
broker's keys under the run's prefix (so runs can share a Redis and the run can delete its keys).

`celery -A bench.plain_celery worker` builds the app from `STEPQ_BENCH_PLAIN_{REDIS_URL,PREFIX}`; the
benchmark process builds the same app with `build_plain_app` to send the first task.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

PLAIN_NOOP = "bench.plain.noop"


def plain_queue(prefix: str) -> str:
    return f"{prefix}.plain"


def plain_done_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:bench:plain-done:{run_id}"


def build_plain_app(redis_url: str, prefix: str) -> Celery:
    app = Celery("bench-plain", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"global_keyprefix": f"{prefix}."},  # key names only
    )
    queue = plain_queue(prefix)
    done = redis.Redis.from_url(redis_url)

    @app.task(name=PLAIN_NOOP)
    def noop(run_id: str, remaining: int) -> None:
        """Re-enqueue itself, like run_step enqueues the next step; the last one says it is done."""
        if remaining > 1:
            app.send_task(PLAIN_NOOP, args=[run_id, remaining - 1], queue=queue)
        else:
            done.rpush(plain_done_key(prefix, run_id), "done")

    return app


def __getattr__(name: str) -> Any:
    """`app` is built on first access (by `celery -A bench.plain_celery`), from the environment."""
    if name == "app":
        value = build_plain_app(os.environ["STEPQ_BENCH_PLAIN_REDIS_URL"], os.environ["STEPQ_BENCH_PLAIN_PREFIX"])
        globals()["app"] = value
        return value
    raise AttributeError(name)
