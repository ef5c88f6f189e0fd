"""The module-level app for `celery -A stepq.workers.celery_app worker` (what `stepq worker` runs)."""

from stepq.workers.app import create_app

app = create_app()
