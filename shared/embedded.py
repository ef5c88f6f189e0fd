"""The embedded mode's in-process worker, shared by `Client`, `stepq demo`, `stepq run` and `stepq batch`.

Embedded mode (STEPQ_REDIS_URL unset) keeps state in an in-process Redis stand-in and messages
on Celery's `memory://` transport, so nothing outside this process can run a turn: the worker
has to live here too. This is the one composition module that imports worker code, and only
lazily, inside `_Worker.start`: the producer imports `stepq.embedded`, never `stepq.workers`.

One worker per (key prefix, queue) runs at a time, reference-counted: the CLI's `local_worker`
block and a `Client` that started one on its first submit share it, and it stops when the last
user releases it (or at interpreter exit).

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours (see the end)
import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from celery import Celery

from stepq.config.settings import Settings
from stepq.fleet.protocol import SWEEP, worker_queues

DEMO_MODULE = "stepq.agents.demo"
# How long `Client.events()` / `wait()` wait for an embedded worker to exist before giving up on a turn.
NO_WORKER_AFTER_S = 15.0


def with_demo_agents(settings: Settings) -> Settings:
    """The same settings with the bundled demo agents loaded (the embedded mode has no other default)."""
    if DEMO_MODULE in settings.agent_modules:
        return settings
    return settings.model_copy(update={"agent_modules": [*settings.agent_modules, DEMO_MODULE]})


class _Worker:
    """A threads-pool Celery worker for one Settings, running in this process."""

    def __init__(self, settings: Settings, concurrency: int) -> None:
        self.settings = settings
        self.concurrency = concurrency
        self.users = 0
        self._stack = ExitStack()
        self._app: Celery | None = None

    def start(self) -> None:
        # lazy: Celery and the worker code load only when an in-process worker starts (the library imports
        # no Celery; see the embedded-lazy rule of tests/test_import_graph.py)
        from celery.contrib.testing.worker import start_worker

        from stepq.workers.app import create_app

        # memory:// URLs have no host; kombu warns about that on every connection
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)
        app = create_app(self.settings)
        self._stack.enter_context(
            start_worker(
                app,
                pool="threads",
                concurrency=self.concurrency,
                perform_ping_check=False,
                loglevel="WARNING",
                queues=worker_queues(self.settings),
                shutdown_timeout=30.0,
            )
        )
        self._app = app

    def stop(self) -> None:
        from celery.worker import state as worker_state

        app = self._app
        if app is None:
            return
        self._app = None
        # Celery's sync loop notices a shutdown only after its current broker poll, and then polls
        # once more (up to 2 s each on memory://). Two no-op sweeps end both polls at once.
        worker_state.should_terminate = 0
        for _ in range(2):
            app.send_task(SWEEP, queue=self.settings.queue)
        self._stack.close()


_lock = threading.Lock()
_workers: dict[tuple[str, str], _Worker] = {}


def _key(settings: Settings) -> tuple[str, str]:
    """What decides which turns a worker serves: the key prefix (state) and the queue (messages)."""
    return (settings.key_prefix, settings.queue)


def acquire(settings: Settings, concurrency: int = 4) -> None:
    """Make sure a worker serves `settings` in this process; each call needs one `release`."""
    with _lock:
        worker = _workers.get(_key(settings))
        if worker is None:
            worker = _Worker(settings, concurrency)
            worker.start()
            _workers[_key(settings)] = worker
        worker.users += 1


def release(settings: Settings) -> None:
    """Drop one use of the worker for `settings`; the last one stops it."""
    with _lock:
        worker = _workers.get(_key(settings))
        if worker is None:
            return
        worker.users -= 1
        if worker.users > 0:
            return
        del _workers[_key(settings)]
        worker.stop()


def worker_running(settings: Settings) -> bool:
    """True while an embedded worker serves these settings' turns in this process."""
    return _key(settings) in _workers


@contextmanager
def local_worker(settings: Settings, concurrency: int = 4) -> Iterator[None]:
    """Run (or share) an embedded worker for `settings` while the block runs."""
    acquire(settings, concurrency)
    try:
        yield
    finally:
        release(settings)


def _stop_all() -> None:
    """A `Client` that was never closed: stop its worker at interpreter exit.

    A step still running dies with the process (embedded state lives in its memory anyway), and
    the interpreter refuses its thread pools new work from here on: the step's failure is not
    news worth a traceback on the way out.
    """
    with _lock:
        workers = list(_workers.values())
        _workers.clear()
    if workers:
        logging.getLogger("celery.app.trace").setLevel(logging.CRITICAL)
    for worker in workers:
        worker.stop()


# Before `atexit`: the interpreter first shuts down every ThreadPoolExecutor (the threads pool's too) in
# threading's own exit hooks, run in reverse order of registration, and a worker still consuming after
# that fails on its next message. Registered after concurrent.futures', this hook runs before it.
getattr(threading, "_register_atexit", atexit.register)(_stop_all)
