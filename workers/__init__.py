"""The Celery app and its tasks. Thin: every durable decision is made in the library (`stepq`).

May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.cancel`, `stepq.approvals`, `stepq.config`,
`stepq.logging`, `stepq.providers`, `stepq.agents`, `stepq.policy`, `stepq.store`, `stepq.fleet`, `stepq.turns`,
`stepq.batches`, `stepq.engine`.
Never the producer (tasks are sent by name) nor `stepq.embedded` (it imports the workers).

Internal: run workers with `stepq worker` (or `celery -A stepq.workers.celery_app`); nothing in here
is an API to import.
"""

if __name__ != "stepq.workers":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq.workers, not {__name__}: this folder is installed as the package stepq.workers")
