"""Messages a broker outage strands are sent again at the next sweep, not after the queued grace period.

When a worker loses its broker connection, the messages it held are stranded: kombu's Redis transport
pops a message and only then records it as unacknowledged, so a reply lost in a Redis restart loses the
message; a message the worker had reserved, or held for a countdown (a retry, a lease reschedule), sits
in the dead channel's unacked set, and restoring it needs the Redis that just went away, so it comes back
only after the visibility timeout. Nothing in Redis tells such a turn from one still waiting in its queue,
and the sweeper's catch-all for lost messages (`STEPQ_QUEUED_GRACE_S`, 300 s) is long.

So a worker whose consumer *reconnects* records the moment (`Keys.broker_reconnected`), and the sweeper
sends again every queued turn untouched since then (once: the re-send moves the turn's index score past
the mark). A turn whose message was not lost gets a spare duplicate, which is a no-op.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery, bootsteps

from stepq.config.settings import Settings
from stepq.fleet.runtime import get_runtime

log = logging.getLogger("stepq.worker")


class ReconnectMark(bootsteps.StartStopStep):
    """A consumer step: its `start` runs on every (re)connection; all but the first record a reconnect."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.connected_before = False

    def start(self, parent: Any) -> None:
        if self.connected_before:
            settings: Settings = parent.app.conf.stepq_settings
            # Redis may still be down (another broker, or the same Redis coming back): never hold up the consumer
            threading.Thread(target=mark_reconnect, args=(settings,), name="stepq-reconnect", daemon=True).start()
        self.connected_before = True


def mark_reconnect(settings: Settings, now: float | None = None) -> None:
    """Record that a consumer reconnected at `now`: the sweeper re-sends what the outage may have stranded."""
    rt = get_runtime(settings)
    try:
        rt.redis.set(rt.keys.broker_reconnected, repr(now if now is not None else time.time()))
    except Exception as exc:  # Redis outlived its outage window: the queued grace period still covers it
        log.warning("could not record the broker reconnect (%s); stranded steps wait for the sweeper's grace", exc)
    else:
        log.warning("broker connection re-established: the next sweep re-sends steps the outage may have stranded")


def install(app: Celery) -> None:
    app.steps["consumer"].add(ReconnectMark)
