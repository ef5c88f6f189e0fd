"""`celery -A bench.provider_batch_worker worker`: stepq's app, plus each task's runtime (task_prerun ->
task_postrun, per task id) added to a Redis hash of the run, so `bench.provider_batch` can read the
worker-seconds held from outside the worker process."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.signals import task_postrun, task_prerun

from stepq.config.settings import Settings
from stepq.store.connection import get_redis
from stepq.workers.app import create_app


def held_key(settings: Settings) -> str:
    return f"{settings.key_prefix}:bench:held"


app = create_app()
_settings: Settings = app.conf.stepq_settings
_started: dict[str, float] = {}
_lock = threading.Lock()


@task_prerun.connect(weak=False)
def _pre(task_id: str | None = None, **_: Any) -> None:
    with _lock:
        _started[str(task_id)] = time.perf_counter()


@task_postrun.connect(weak=False)
def _post(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    now = time.perf_counter()
    with _lock:
        began = _started.pop(str(task_id), None)
    if began is not None:
        name = getattr(task, "name", "?")
        pipe = get_redis(_settings).pipeline(transaction=False)
        pipe.hincrbyfloat(held_key(_settings), name, now - began)
        pipe.hincrby(held_key(_settings), f"{name}:count", 1)
        pipe.execute()
