"""The module-level app for `celery -A stepq.workers.celery_app worker` (what `stepq worker` runs) and `… beat`.

The settings are read here, at import: a bad STEPQ_* value stops the worker (and its beat) before it
starts, with one line naming the variable instead of Celery's traceback of a failed `-A` import. So does a
Redis that does not answer at start (a wrong STEPQ_REDIS_URL, a server not up): one line naming the URL
within seconds, not a worker that waits an outage window out on every call (see `first_contact`).
"""

import os
import sys

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from stepq.config.settings import get_settings
from stepq.errors import ConfigurationError
from stepq.logging import redact_url
from stepq.store.connection import first_contact
from stepq.workers.app import create_app

# Agent modules (STEPQ_AGENT_MODULES) import from the current directory, as under `stepq worker` (python -m):
# `celery -A` puts it on sys.path only while it imports this module (then removes that first copy), and steps
# load agents later. This copy stays; at the end, so an agent module never shadows an installed package.
sys.path.append(os.getcwd())

try:
    settings = get_settings()
    if not settings.embedded:
        first_contact(settings)
    app = create_app(settings)
except ConfigurationError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None
except (RedisConnectionError, RedisTimeoutError) as exc:
    cause = " ".join(str(exc).split()) or type(exc).__name__
    print(
        f"error: cannot reach Redis at {redact_url(settings.redis_url or '')} ({cause}); "
        "is it running, and is STEPQ_REDIS_URL right?",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(1) from None
