"""The module-level app for `celery -A stepq.workers.celery_app worker` (what `stepq worker` runs) and `… beat`.

The settings are read here, at import: a bad STEPQ_* value stops the worker (and its beat) before it
starts, with one line naming the variable instead of Celery's traceback of a failed `-A` import.
"""

import os
import sys

from stepq.errors import ConfigurationError
from stepq.workers.app import create_app

# Agent modules (STEPQ_AGENT_MODULES) import from the current directory, as under `stepq worker` (python -m):
# `celery -A` puts it on sys.path only while it imports this module (then removes that first copy), and steps
# load agents later. This copy stays; at the end, so an agent module never shadows an installed package.
sys.path.append(os.getcwd())

try:
    app = create_app()
except ConfigurationError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None
