"""Quiet routine tasks: Celery's INFO bookkeeping about the sweeper, the provider-batch tick and each step is dropped.

At one sweep every 1.5 s, beat's "Sending due task" and the worker's "received" / "succeeded" lines were nine
lines in ten of a worker's log. The tasks log what they did themselves, and nothing when they did nothing.
A step (`run_step`) logs one line per delivery with its turn, step and attempt ("step done; next step N",
"step delivery ended: …"); Celery's two lines beside it named only the task id, and each cost ~50-70 us of CPU
(record, redaction, formatting, write) at the `stepq worker` default level, INFO: a tenth of a step's budget.
"""

from __future__ import annotations

import logging

from stepq.fleet.protocol import PROVIDER_BATCH_TICK, RUN_STEP, SWEEP

# periodic, or logged by the task itself: Celery's lines about each run are noise
QUIET_TASKS = frozenset({SWEEP, PROVIDER_BATCH_TICK, RUN_STEP})


class RoutineTaskFilter(logging.Filter):
    """Drops Celery's INFO (and lower) records about the quiet tasks; everything else (a failure) passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or _celery_task_of(record) not in QUIET_TASKS


def _celery_task_of(record: logging.LogRecord) -> str | None:
    """The task a Celery bookkeeping record is about (its format arguments name it), or None."""
    if not record.name.startswith("celery"):
        return None
    args = record.args
    if isinstance(args, dict):  # the worker's "Task %(name)s[%(id)s] received" / "... succeeded in ..."
        return str(args.get("name"))
    if record.name == "celery.beat" and isinstance(args, tuple) and len(args) == 2:  # "Sending due task %s (%s)"
        return str(args[1])
    return None


def quiet_routine_tasks(logger: logging.Logger) -> None:
    """Put the filter first on every handler of `logger` (Celery's root and task loggers after it set them up):
    it reads the record's arguments, which the redaction filter after it formats into the message."""
    for handler in logger.handlers:
        if not any(isinstance(f, RoutineTaskFilter) for f in handler.filters):
            handler.filters.insert(0, RoutineTaskFilter())
