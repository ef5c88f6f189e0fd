"""The worker's Celery app: one result backend for the whole process, not one per thread or greenlet."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from celery.backends.base import DisabledBackend

from stepq.workers.app import create_app
from stepq.workers.tasks import RUN_STEP


def _backends_seen_by(app, threads: int = 3) -> list[tuple[object, object]]:
    """(app.backend, the step task's backend) as each of `threads` threads sees them, one slot per thread."""
    seen: list[tuple[object, object]] = [(None, None)] * threads

    def look(slot: int) -> None:
        seen[slot] = (app.backend, app.tasks[RUN_STEP].backend)

    workers = [threading.Thread(target=look, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return seen


def test_every_thread_and_task_shares_one_disabled_backend(settings):
    """Celery builds `app.backend` per thread on first use (~0.2 ms of config reads each): a 300-thread
    worker paid it in most of its steps' ends. stepq keeps no results, so one stateless backend serves all."""
    app = create_app(settings)
    seen = [b for pair in _backends_seen_by(app) for b in pair]
    assert isinstance(seen[0], DisabledBackend)
    assert all(b is seen[0] for b in seen)
    assert app.backend is seen[0]


def test_a_configured_result_backend_stays_celerys_own_per_thread(settings):
    app = create_app(settings)
    app.conf.result_backend = "cache+memory://"
    (first, first_task), (second, _) = _backends_seen_by(app, threads=2)
    assert not isinstance(first, DisabledBackend)
    assert first_task is first
    assert first is not second  # Celery's thread-local instances, as Celery makes them


GEVENT_CHILD = """
from gevent import monkey
monkey.patch_all()
import gevent
from stepq.workers.app import create_app
app = create_app()
found = gevent.joinall([gevent.spawn(lambda: app.backend) for _ in range(3)])
print(len({id(g.value) for g in found}), type(found[0].value).__name__)
"""


def test_under_gevent_every_greenlet_shares_it_too():
    """Under gevent Celery's thread-local is greenlet-local: without the shared backend, each task's greenlet
    built its own."""
    pytest.importorskip("gevent")
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "DisabledBackend"]
