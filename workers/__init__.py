"""The Celery app and its tasks. Thin: every durable decision is made in `shared`."""

if __name__ != "stepq.workers":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq.workers, not {__name__}: this folder is installed as the package stepq.workers")
