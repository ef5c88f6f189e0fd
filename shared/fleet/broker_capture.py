"""A Celery send taken as the Redis command kombu would run, so the store can run it in its own transaction.

A submit stored its turn (one MULTI) and then sent the turn's first step through Celery: a second round trip and
~0.3-0.8 ms of kombu's CPU before a worker could start, and a window in which a submitter that died left a stored
turn with no message (found later by `never_dispatched` or the sweeper). When the broker is the store's own Redis,
the create script can push the message itself, only if it stores the turn: one round trip, and no turn stored
without its message or message sent without its turn.

The message is still Celery's and kombu's: `captured()` lets `send_task` build and route it as for any send
(headers, priority, the queue's key, serialization), and takes the final Redis commands through the hook kombu's
Redis transport has for its publish batches (`Channel._put(..., _publish_batch=...)`, kombu >= 5.7) instead of
running them. With an older kombu, or any other transport, nothing is taken and the caller sends as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from stepq.errors import StepqError
from stepq.store.broker_push import BrokerPush

_local = threading.local()
_installed = False


class NotCaptured(StepqError):
    """A send needed more than LPUSHes (a queue declared with `x-expires`, which stepq's queues are not): nothing
    was sent, and the caller sends it the usual way."""


@dataclass
class _Collector:
    """Stands in for kombu's publish batch while a send is captured: holds the commands kombu hands it."""

    prefix: str = ""
    commands: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))


def install() -> bool:
    """Patch `kombu.transport.redis.Channel._put` once per process (idempotent); False when this kombu has no
    publish-batch hook to take a send through (then `captured()` takes nothing)."""
    global _installed
    if _installed:
        return True
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # the Redis transport needs redis-py; without it there is nothing to capture
        return False
    if not hasattr(kombu_redis.Channel, "create_publish_batch"):  # kombu < 5.7: `_put` would send at once
        return False
    original = kombu_redis.Channel._put

    def _put(self: Any, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        collector: _Collector | None = getattr(_local, "collector", None)
        if collector is not None and kwargs.get("_publish_batch") is None:
            collector.prefix = self.global_keyprefix
            kwargs["_publish_batch"] = collector
        return original(self, queue, message, **kwargs)

    kombu_redis.Channel._put = _put  # type: ignore[method-assign]
    _installed = True
    return True


@contextmanager
def captured() -> Iterator[list[BrokerPush]]:
    """Within the block, this thread's Redis-broker sends are not run: each becomes a BrokerPush in the yielded
    list (filled when the block ends), for the caller to run; NotCaptured when a send needed more than its LPUSH."""
    collector = _Collector()
    pushes: list[BrokerPush] = []
    _local.collector = collector
    try:
        yield pushes
    finally:
        _local.collector = None
    if any(name != "lpush" for name, _ in collector.commands):
        raise NotCaptured(f"a captured send needs {[name for name, _ in collector.commands]}, not LPUSH alone")
    pushes.extend(BrokerPush(collector.prefix + str(key), str(body)) for _, (key, body) in collector.commands)
