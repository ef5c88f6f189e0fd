"""The module-level app for `celery -A workers.celery_app worker` (what `agentq worker` runs)."""

from workers.app import create_app

app = create_app()
