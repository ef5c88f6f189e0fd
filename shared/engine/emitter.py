"""A step's event writer: coalesces content deltas per flush window, tracks whether content went out.

Deltas of one kind are buffered for at most `window_s`; the first delta after a quiet
window goes out at once (no added latency on slow streams). A process-wide timer
thread flushes buffers whose window ended with no further delta. Every publish of a
step happens under the step's lock, so seq order matches the order things happened.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any

from shared.models import EventType
from shared.providers.base import Delta
from shared.store.events import EventLog

_KIND_EVENT = {"text": EventType.TEXT_DELTA, "reasoning": EventType.REASONING_DELTA, "object": EventType.OBJECT_DELTA}


class _FlushTimer:
    """One daemon thread that flushes coalescing buffers when their window ends."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, StepEmitter]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def schedule(self, when: float, emitter: StepEmitter) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._counter), emitter))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agentq-flush", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                when, _, emitter = self._heap[0]
                delay = when - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
            emitter.flush_if_due()


_TIMER = _FlushTimer()


class StepEmitter:
    def __init__(self, log: EventLog, turn_id: str, step: int, window_s: float) -> None:
        self.log = log
        self.turn_id = turn_id
        self.step = step
        self.window_s = window_s
        self.emitted_content = False
        self.text_parts: list[str] = []
        self._lock = threading.Lock()
        self._kind: str | None = None
        self._buffer: list[str] = []
        self._buffer_started = 0.0
        self._last_flush = 0.0

    def emit(self, delta: Delta) -> None:
        """Called by the adapter for each streamed delta."""
        if not delta.text:
            return
        with self._lock:
            self.emitted_content = True
            if delta.kind == "text":
                self.text_parts.append(delta.text)
            now = time.monotonic()
            if self._kind is not None and self._kind != delta.kind:
                self._flush_locked()
            if self.window_s <= 0 or (not self._buffer and now - self._last_flush >= self.window_s):
                self._kind = delta.kind
                self._buffer.append(delta.text)
                self._flush_locked()
                return
            if not self._buffer:
                self._buffer_started = now
                self._kind = delta.kind
                _TIMER.schedule(now + self.window_s, self)
            self._buffer.append(delta.text)
            if now - self._buffer_started >= self.window_s:
                self._flush_locked()

    def flush_if_due(self) -> None:
        with self._lock:
            if self._buffer and time.monotonic() - self._buffer_started >= self.window_s * 0.999:
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def publish(self, type_: EventType, data: dict[str, Any]) -> int:
        """Publish a non-delta event after any buffered deltas, keeping seq order."""
        with self._lock:
            self._flush_locked()
            return self.log.publish(self.turn_id, type_, self.step, data)

    def _flush_locked(self) -> None:
        if not self._buffer or self._kind is None:
            return
        text = "".join(self._buffer)
        self._buffer.clear()
        self.log.publish(self.turn_id, _KIND_EVENT[self._kind], self.step, {"text": text})
        self._last_flush = time.monotonic()
        self._kind = None
