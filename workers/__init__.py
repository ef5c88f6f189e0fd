"""The Celery app and its tasks. Thin: every durable decision is made in the library (`stepq`).

Internal: run workers with `stepq worker` (or `celery -A stepq.workers.celery_app`); nothing in here
is an API to import.
"""

if __name__ != "stepq.workers":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq.workers, not {__name__}: this folder is installed as the package stepq.workers")
