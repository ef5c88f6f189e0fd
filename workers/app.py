"""The Celery application, configured from `AGENTQ_*` settings."""

from __future__ import annotations

from celery import Celery

from shared.config import Settings, get_settings
from shared.protocol import celery_config


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("agentq")
    app.conf.update(celery_config(settings))
    app.conf.agentq_settings = settings
    from workers.signals import install_signals
    from workers.tasks import register_tasks

    register_tasks(app)
    install_signals()  # logs, /metrics and heartbeat; they act only in a `celery worker` program
    return app
