"""The Celery app and its tasks. Thin: every durable decision is made in `shared`."""
