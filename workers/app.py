"""The Celery application, configured from `STEPQ_*` settings."""

from __future__ import annotations

from celery import Celery

from stepq.config.settings import Settings, get_settings
from stepq.fleet import broker_clients
from stepq.fleet.protocol import celery_config
from stepq.workers import kombu_fixes, reconnects
from stepq.workers.signals import install_signals
from stepq.workers.tasks import register_tasks


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    kombu_fixes.install()  # a worker must survive its broker connection going away (see the module)
    broker_clients.install()  # one Redis client per broker channel, not one per publish and ack
    app = Celery("stepq")
    app.conf.update(celery_config(settings))
    app.conf.stepq_settings = settings
    register_tasks(app)
    reconnects.install(app)  # what an outage strands is re-sent at the next sweep
    install_signals()  # logs, /metrics and heartbeat; they act only in a `celery worker` program
    return app
