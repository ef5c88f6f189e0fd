"""A step's event writer: coalesces content deltas per flush window, tracks whether content went out.

Deltas of one kind (and, for tool input, of one tool call) are buffered for at most `window_s`; the first delta after a quiet
window goes out at once (no added latency on slow streams). A process-wide timer
thread flushes buffers whose window ended with no further delta (all that are due in one
round trip). Bookkeeping events a step may `defer` (step-start, step-finish, tool calls and
results) wait in the same ordered buffer and go out with the next write, or when their
window ends, so a step spends few round trips on them. So do deferred writes
(`defer_write`: a step's checkpoint, a tool's stored result); they go just ahead of the
events in the same trip, and `settle` sends them at once when something depends on them.
All of a flush's events are one script call. Every write of a step happens under the
step's lock, so seq order matches the order things happened.

A delta emitted on the provider loop's thread (a stream pumped there, `providers.loop_transport`) is
*staged* instead: appended to a queue with no lock and no round trip (that thread reads every stream
of the process and must never wait), and the timer thread moves it into the buffer and writes it,
together with every other step's due events, in one round trip.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.commands.core import Script

from stepq.io_loop import in_loop_thread
from stepq.models import Delta, EventType, ToolInputDelta
from stepq.store.events import EventLog, PendingPublish

_log = logging.getLogger("stepq.emitter")

WriteArgs = list[Any] | Callable[[], list[Any]]
OnReply = Callable[[Any, BaseException | None], None]  # a deferred write's reply, or the error that lost it

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
            sooner = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._counter), emitter))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="stepq-flush", daemon=True)
                self._thread.start()
            if sooner:  # otherwise the thread already wakes up in time: no wake-up per buffered delta
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                # an emitter with nothing waiting flushed before its window ended: its entry is moot, and
                # dropping it here saves a wake-up (one per step when steps are shorter than the window)
                while self._heap and self._heap[0][2].idle():
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                when = self._heap[0][0]
                now = time.monotonic()
                if when > now:
                    self._cond.wait(when - now)
                    continue
                due: dict[StepEmitter, None] = {}
                while self._heap and self._heap[0][0] <= now:
                    due[heapq.heappop(self._heap)[2]] = None
            flush_due(list(due))


def flush_due(emitters: list[StepEmitter]) -> None:
    """Flush every buffer whose window ended, in one round trip. Each flush is queued under its emitter's
    lock (so its events keep their place among the step's writes: queued order is written order), and
    the lock is let go at once when the flush is only events; a flush that carries a write (a checkpoint,
    a tool's result) keeps its lock until that is stored, so `settle` can never see it as stored early.
    Holding the lock of an events-only flush through the round trip would stall its step (and a stream on
    the provider loop) behind every other write in the batch."""
    held: list[StepEmitter] = []
    started: list[tuple[StepEmitter, list[PendingPublish]]] = []
    try:
        for emitter in emitters:
            emitter._lock.acquire()
            keep = False
            try:
                pending = emitter._start_flush_locked() if emitter._due_locked() else []
                if pending:
                    started.append((emitter, pending))
                    keep = any(p.script is not None for p in pending)
            except Exception as exc:  # keep the timer alive; the buffer's text is lost to subscribers, as before
                _log.warning("timed flush of turn %s failed: %s", emitter.turn_id, type(exc).__name__)
                emitter._stream_failure = exc  # a stream still staging deltas stops on it
            finally:
                if keep:
                    held.append(emitter)
                else:
                    emitter._lock.release()
        for emitter, pending in started:
            try:
                emitter._end_flush_locked(pending)
            except Exception as exc:
                _log.warning("timed flush of turn %s failed: %s", emitter.turn_id, type(exc).__name__)
                emitter._stream_failure = exc
                if any(p.script is not None for p in pending):  # a write, not only events, was lost:
                    emitter._lost_write = exc  # `settle` must not report it as stored
    finally:
        for emitter in held:
            emitter._lock.release()


_TIMER = _FlushTimer()


class StepEmitter:
    def __init__(self, log: EventLog, turn_id: str, step: int, window_s: float) -> None:
        self.log = log
        self.turn_id = turn_id
        self.step = step
        self.window_s = window_s
        self.emitted_content = False  # text, reasoning or object deltas went out: a retry needs the agent's consent
        self.emitted_tool_input = False  # tool-input deltas went out: a retry must reset the step (see failure.py)
        self.text_parts: list[str] = []
        self._lock = threading.Lock()
        self._kind: str | None = None
        self._call_id = ""  # the tool call whose input the buffer holds (kind `tool-input`)
        self._call_name = ""
        self._buffer: list[str] = []
        self._buffer_started = 0.0
        self._last_flush = -math.inf  # a step's first delta goes out at once, whatever the monotonic clock reads
        self._deferred: list[tuple[EventType, dict[str, Any]]] = []
        self._writes: list[tuple[Script, list[str], WriteArgs, OnReply | None]] = []
        self._replies: dict[PendingPublish, OnReply] = {}  # writes gone out whose reply someone waits for
        self._deferred_since = 0.0
        self._lost_write: Exception | None = None
        self._staged: deque[Delta] = deque()  # deltas from the provider loop, not in the buffer yet
        self._staged_scheduled = False  # the timer will take them (one schedule per batch, not per delta)
        self._stream_failure: Exception | None = None  # a timed flush failed: the next staged delta raises it

    def idle(self) -> bool:
        """Nothing buffered or deferred (read without the lock: a stale answer only costs a wake-up, since
        whatever is queued next schedules its own flush)."""
        return not (self._buffer or self._deferred or self._writes or self._staged)

    def emit(self, delta: Delta) -> None:
        """Called by the adapter for each streamed delta."""
        if not delta.text:
            return
        if in_loop_thread():
            self._stage(delta)
            return
        with self._lock:
            now = time.monotonic()
            self._drain_staged_locked(now)
            if delta.kind == "text":
                self.text_parts.append(delta.text)
                self.emitted_content = True
            elif isinstance(delta, ToolInputDelta):  # coalesced per call: another call's input is its own event
                if self._kind == "tool-input" and self._call_id != delta.call_id:
                    self._defer_buffer_locked(now)
                self._call_id, self._call_name = delta.call_id, delta.tool_name
                self.emitted_tool_input = True
            else:
                self.emitted_content = True
            if self._kind is not None and self._kind != delta.kind:
                self._defer_buffer_locked(now)
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

    def _stage(self, delta: Delta) -> None:
        """A delta from the provider loop: queued without the lock (the timer thread may hold it through a
        round trip) and written by the timer, at once after a quiet window, else when the window ends."""
        if self._stream_failure is not None:  # as the inline write would have raised: the stream stops
            raise self._stream_failure
        if delta.kind == "text":
            self.text_parts.append(delta.text)
            self.emitted_content = True
        elif isinstance(delta, ToolInputDelta):
            self.emitted_tool_input = True
        else:
            self.emitted_content = True
        self._staged.append(delta)
        if not self._staged_scheduled:
            self._staged_scheduled = True
            _TIMER.schedule(max(time.monotonic(), self._last_flush + self.window_s), self)

    def _drain_staged_locked(self, now: float) -> None:
        """Move staged deltas into the buffer, coalescing them as `emit` would (kind, tool call)."""
        if not self._staged:
            return
        self._staged_scheduled = False  # before taking them: a delta staged from here on schedules again
        staged = self._staged
        while staged:
            delta = staged.popleft()
            if isinstance(delta, ToolInputDelta):
                if self._kind == "tool-input" and self._call_id != delta.call_id:
                    self._defer_buffer_locked(now)
                self._call_id, self._call_name = delta.call_id, delta.tool_name
            if self._kind is not None and (self._kind != delta.kind or self.window_s <= 0):
                self._defer_buffer_locked(now)  # no window: each delta is its own event, as `emit` writes it
            if not self._buffer:
                self._buffer_started = now
                self._kind = delta.kind
            self._buffer.append(delta.text)

    def flush_if_due(self) -> None:
        with self._lock:
            if self._due_locked():
                self._flush_locked()

    def _due_locked(self) -> bool:
        if self._staged:
            return True  # the timer took them when their schedule came up
        elapsed = time.monotonic() - self.window_s * 0.999
        return bool(self._buffer and self._buffer_started <= elapsed) or bool(
            (self._deferred or self._writes) and self._deferred_since <= elapsed
        )

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def publish(self, type_: EventType, data: dict[str, Any]) -> None:
        """Publish an event now, after everything buffered, in one round trip."""
        with self._lock:
            self._deferred.append((type_, data))
            self._flush_locked()

    def flush_with(self, *writes: tuple[Script, list[str], list[Any]]) -> list[Any]:
        """Flush, and run other writes (a commit, a checkpoint) after the events in the same round trip;
        returns those writes' replies."""
        with self._lock:
            queued = self._start_flush_locked()
            extra = [self.log.submit_script(script, keys, args) for script, keys, args in writes]
            self._end_flush_locked(queued)
            return [self.log.wait_script(p) for p in extra]

    def defer(self, type_: EventType, data: dict[str, Any]) -> None:
        """Queue an event to go out with the step's next write, or within the flush window."""
        with self._lock:
            now = time.monotonic()
            self._drain_staged_locked(now)
            self._defer_buffer_locked(now)
            self._schedule_deferred_locked(now)
            self._deferred.append((type_, data))

    def defer_write(self, script: Script, keys: list[str], args: WriteArgs, on_reply: OnReply | None = None) -> None:
        """Queue a write to go out in the step's next round trip (or when the flush window ends); `settle`
        sends it now. `args` may be a function, called only if the write goes out (not if discarded);
        `on_reply` gets the write's reply (or the error that lost it) under the step's lock, as it comes back."""
        with self._lock:
            self._schedule_deferred_locked(time.monotonic())
            self._writes.append((script, keys, args, on_reply))

    def discard_write(self, script: Script, keys: list[str]) -> None:
        """Drop queued writes of `script` to `keys` that a later write makes moot. Takes the step's lock: a
        flush that carries such a write has its reply in when this returns."""
        with self._lock:
            self._writes = [w for w in self._writes if not (w[0] is script and w[1] == keys)]

    def settle(self) -> None:
        """Send deferred writes (and the events ahead of them) now, if there are any; raises if a write
        queued earlier was lost in a timed flush."""
        with self._lock:
            if self._lost_write is not None:
                raise self._lost_write
            if self._writes:
                self._flush_locked()

    def _schedule_deferred_locked(self, now: float) -> None:
        if not self._deferred and not self._writes:
            self._deferred_since = now
            _TIMER.schedule(now + max(self.window_s, 0.001), self)

    def _defer_buffer_locked(self, now: float) -> None:
        """Move buffered deltas into the ordered queue (they stay ahead of what comes next)."""
        if self._buffer and self._kind is not None:
            if not self._deferred and not self._writes:
                self._deferred_since = self._buffer_started
            self._deferred.append(self._buffered_event_locked(self._kind))
            self._buffer.clear()
            self._kind = None

    def _buffered_event_locked(self, kind: str) -> tuple[EventType, dict[str, Any]]:
        """The buffer as one event: a tool call's input names its call (and its tool, on every piece, so a
        subscriber that joins late or after a reset can still open the call's part)."""
        text = "".join(self._buffer)
        if kind == "tool-input":
            return EventType.TOOL_INPUT_DELTA, {"id": self._call_id, "name": self._call_name, "text": text}
        return _KIND_EVENT[kind], {"text": text}

    def _flush_locked(self) -> None:
        pending = self._start_flush_locked()
        if pending:
            self._end_flush_locked(pending)

    def _start_flush_locked(self) -> list[PendingPublish]:
        """Queue everything waiting, in order (not written yet: `_end_flush_locked` waits for it). Deferred
        writes go first: an event a subscriber sees (a tool's result) is already stored."""
        self._drain_staged_locked(time.monotonic())
        queued = []
        for script, keys, args, on_reply in self._writes:
            pending = self.log.submit_script(script, keys, args() if callable(args) else args)
            if on_reply is not None:
                self._replies[pending] = on_reply
            queued.append(pending)
        self._writes.clear()
        events = [(type_, self.step, data) for type_, data in self._deferred]
        self._deferred.clear()
        if self._buffer and self._kind is not None:
            type_, data = self._buffered_event_locked(self._kind)
            events.append((type_, self.step, data))
            self._buffer.clear()
        self._kind = None  # the buffer is taken: the next delta opens a new one
        if events:
            queued.append(self.log.submit_many(self.turn_id, events))
        return queued

    def _end_flush_locked(self, pending: list[PendingPublish]) -> None:
        """Wait for a started flush (the timer calls it without the lock for an events-only flush); raises
        the first write's error, once every write of it has its answer."""
        failed: BaseException | None = None
        for item in pending:
            reply, error = None, None
            try:
                reply = self.log.wait_script(item)
            except BaseException as exc:
                error, failed = exc, failed or exc
            on_reply = self._replies.pop(item, None) if self._replies else None
            if on_reply is not None:
                on_reply(reply, error)
        if failed is not None:
            raise failed
        self._last_flush = time.monotonic()
