"""The embedded mode's in-process worker, for `stepq demo` and `stepq run` without STEPQ_REDIS_URL.

Embedded mode keeps state in an in-process Redis stand-in and messages on Celery's
`memory://` transport, so nothing outside this process could run the turn: the
worker has to live here too. This is the one place the producer package imports
worker code, and only lazily, inside `local_worker`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from stepq.config import Settings
from stepq.protocol import SWEEP, worker_queues

DEMO_MODULE = "stepq.demo_agents"


def with_demo_agents(settings: Settings) -> Settings:
    """The same settings with the bundled demo agents loaded (the embedded mode has no other default)."""
    if DEMO_MODULE in settings.agent_modules:
        return settings
    return settings.model_copy(update={"agent_modules": [*settings.agent_modules, DEMO_MODULE]})


@contextmanager
def local_worker(settings: Settings, concurrency: int = 4) -> Iterator[None]:
    """Run a threads-pool Celery worker for `settings` in this process while the block runs."""
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state as worker_state

    from stepq.workers.app import create_app

    # memory:// URLs have no host; kombu warns about that on every connection
    logging.getLogger("kombu.connection").setLevel(logging.ERROR)
    app = create_app(settings)
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        queues=worker_queues(settings),
        shutdown_timeout=30.0,
    ):
        try:
            yield
        finally:
            # Celery's sync loop notices a shutdown only after its current broker poll, and then polls
            # once more (up to 2 s each on memory://). Two no-op sweeps end both polls at once.
            worker_state.should_terminate = 0
            for _ in range(2):
                app.send_task(SWEEP, queue=settings.queue)
