"""A cancellation flag that can also run callbacks: how a stop reaches work that cannot poll.

A tool that polls `ctx.cancelled.is_set()` (or waits on it) sees a plain `threading.Event`. Work that
cannot poll is stopped by a callback run when the flag is set: an async tool's task is cancelled on its
loop, a subprocess started with `ctx.run_process` is killed. The same class is a step lease's `cancelled`
flag, so a turn's cancellation (seen by the lease heartbeat) is forwarded to the tools it is running.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stepq.errors import ToolCancelledError as ToolCancelledError  # raised where a cancel stops work

log = logging.getLogger("stepq.cancel")


class CancelSignal(threading.Event):
    """A `threading.Event` whose `on_set` callbacks run once, in the thread that sets it."""

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    def set(self) -> None:
        with self._guard:
            first = not self.is_set()
            super().set()
            callbacks, self._callbacks = list(self._callbacks.values()), {}
        if first:
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # a failed stop must not break the one that set the flag
                    log.exception("a cancellation callback failed")

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the flag is set (at once if it already is); returns a function that unsubscribes."""
        with self._guard:
            if not self.is_set():
                key = self._next
                self._next += 1
                self._callbacks[key] = callback
                return lambda: self._forget(key)
        callback()
        return lambda: None

    def _forget(self, key: int) -> None:
        with self._guard:
            self._callbacks.pop(key, None)
