"""A broker message the store pushes itself, in the script that stores what the message is about."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BrokerPush:
    """One message for a Redis broker that is the store's own Redis: LPUSH `message` onto `key` (the queue's
    list, the broker's key prefix included), as kombu's Redis transport would (stepq.fleet.broker_capture)."""

    key: str
    message: str
