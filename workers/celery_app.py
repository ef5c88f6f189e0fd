"""The module-level app for `celery -A stepq.workers.celery_app worker` (what `stepq worker` runs) and `… beat`.

The settings are read here, at import: a bad STEPQ_* value stops the worker (and its beat) before it
starts, with one line naming the variable instead of Celery's traceback of a failed `-A` import.
"""

import sys

from stepq.errors import ConfigurationError
from stepq.workers.app import create_app

try:
    app = create_app()
except ConfigurationError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None
