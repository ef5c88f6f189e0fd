"""The Celery application, configured from `STEPQ_*` settings."""

from __future__ import annotations

from functools import cached_property

from celery import Celery
from celery.backends.base import Backend, DisabledBackend

from stepq.config.settings import Settings, get_settings
from stepq.fleet import broker_clients
from stepq.fleet.protocol import celery_config
from stepq.workers import kombu_fixes, reconnects
from stepq.workers.signals import install_signals
from stepq.workers.tasks import register_tasks


class StepqCelery(Celery):
    """Celery, with one result backend for the process. stepq stores no task results (`result_backend` is
    None), yet Celery builds a backend per thread on first use (`app.backend` is thread-local) — per greenlet
    under gevent, so once per task — and each build reads a dozen config keys (~0.2 ms). The disabled
    backend has no state: every thread can share it."""

    @cached_property
    def _shared_backend(self) -> Backend | None:
        """Decided at the first use (the configuration is final by then): a configured backend, which has
        connections, stays Celery's per-thread one."""
        return None if self.conf.result_backend else DisabledBackend(app=self)

    @property
    def backend(self) -> Backend:
        return self._shared_backend or super().backend


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    kombu_fixes.install()  # a worker must survive its broker connection going away (see the module)
    broker_clients.install()  # one Redis client per broker channel, not one per publish and ack
    app = StepqCelery("stepq")
    app.conf.update(celery_config(settings))
    app.conf.stepq_settings = settings
    register_tasks(app)
    reconnects.install(app)  # what an outage strands is re-sent at the next sweep
    install_signals()  # logs, /metrics and heartbeat; they act only in a `celery worker` program
    return app
