"""A workaround for kombu's Redis transport (seen with kombu 5.7.0): restoring unacked messages after the
connection was collected crashed the worker.

When a worker loses its broker connection, Celery collects the connection (which detaches the transport:
`transport.client = None`) and closes the channels; a channel that still holds unacknowledged messages
then restores them, which needs a fresh Redis pool, whose parameters kombu reads from `transport.client`:
`AttributeError: 'NoneType' object has no attribute 'hostname'`. That is not a connection error, so the
consumer treats it as unrecoverable and the worker exits (code 1) the moment Redis goes away.

The fix: each channel remembers the connection parameters it was built with, and a detached channel uses
them, so the restore goes through (or, with Redis still down, fails with a connection error, which Celery
retries). `tests/test_outages.py` reproduces the crash against the installed kombu.
"""

from __future__ import annotations

from typing import Any

_installed = False


def install() -> None:
    """Patch `kombu.transport.redis.Channel._connparams` once per process (idempotent)."""
    global _installed
    if _installed:
        return
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # the Redis transport needs redis-py; without it there is nothing to fix
        return
    original = kombu_redis.Channel._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
        known: dict[bool, dict[str, Any]] = self.__dict__.setdefault("_stepq_connparams", {})
        transport = self.connection
        if transport is not None and getattr(transport, "client", None) is not None:
            params: dict[str, Any] = original(self, asynchronous=asynchronous)
            known[asynchronous] = dict(params)
            return params
        if asynchronous in known:
            return dict(known[asynchronous])
        import redis

        raise redis.exceptions.ConnectionError("the broker connection was closed before this channel connected")

    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]
    _installed = True
