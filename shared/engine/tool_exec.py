"""Running one tool function: on the shared executor, bounded, cancellable, its failure sanitised.

- A tool's exception reaches the model as `<ExceptionType>: <message>`, the message on one line, cut to
  `STEPQ_TOOL_ERROR_CHARS` and with secrets masked (the log redaction's rules); no stack. The `stepq.agents.tools`
  log has the same one line at WARNING (an embedded `stepq run` prints it on the terminal) and the
  traceback at DEBUG.
- A call that outlives its timeout is told to stop (`ctx.cancelled`): an `async def` tool's task is
  cancelled, a process started with `ctx.run_process` is killed, a polling tool sees the flag. A plain
  function that ignores it keeps its executor thread until it returns, so calls still running past their
  timeout ("lingering") are bounded: per tool by `STEPQ_TOOL_MAX_LINGERING`, and in all to half the
  executor; beyond that a call is refused without taking a thread (`stepq_tool_calls_refused_total`), and
  `stepq_tool_calls_lingering` shows how many there are.
- The turn's cancellation (the step lease's flag, polled by the lease heartbeat) is forwarded to the
  running call's `ctx.cancelled`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any

from stepq.agents.tools import ToolContext, ToolDefinition
from stepq.cancel import CancelSignal, ToolCancelledError
from stepq.config.settings import Settings
from stepq.engine.deadline import BUDGET_SPENT, StepDeadline
from stepq.errors import StepqError
from stepq.fleet.metrics import TOOL_CALLS_LINGERING, TOOL_CALLS_REFUSED, TOOL_TIMEOUTS
from stepq.logging import Redactor, describe_exception, secret_values
from stepq.models import ToolCall

log = logging.getLogger("stepq.tools")
EXECUTOR_THREADS = 64
MAX_LINGERING_TOTAL = EXECUTOR_THREADS // 2  # the other half stays free for calls within their timeout
_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="stepq-tool")


class ProcessExitingError(StepqError):
    """The process is exiting under a step: the tool executor takes no new work (the interpreter shut it
    down). Not the step's fault: it is left unfinished for another worker, never failed for it."""


class _Lingering:
    """Counts, per tool, the calls still running past their reported timeout (this process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def refusal(self, tool: str, per_tool: int) -> str | None:
        with self._lock:
            mine, total = self._counts.get(tool, 0), sum(self._counts.values())
        if mine >= per_tool:
            return f"tool {tool} not run: {mine} earlier calls of it are still running past their timeout"
        if total >= MAX_LINGERING_TOTAL:
            return f"tool {tool} not run: {total} tool calls are still running past their timeout"
        return None

    def add(self, tool: str) -> None:
        with self._lock:
            self._counts[tool] = self._counts.get(tool, 0) + 1
        TOOL_CALLS_LINGERING.labels(tool).inc()

    def remove(self, tool: str) -> None:
        with self._lock:
            self._counts[tool] -= 1
            if not self._counts[tool]:
                del self._counts[tool]
        TOOL_CALLS_LINGERING.labels(tool).dec()

    def count(self, tool: str) -> int:
        with self._lock:
            return self._counts.get(tool, 0)


LINGERING = _Lingering()


@dataclass(frozen=True)
class Outcome:
    output: Any = None
    error: str | None = None  # what the model reads when the call failed


class ToolExecution:
    """How one step runs its tools: its secrets to mask, its limits, its turn's cancellation flag."""

    def __init__(
        self, settings: Settings, turn_cancel: CancelSignal | None = None, deadline: StepDeadline | None = None
    ) -> None:
        self.redact = Redactor(secret_values(settings))
        self.max_lingering = settings.tool_max_lingering
        self.error_chars = settings.tool_error_chars
        self.turn_cancel = turn_cancel
        self.deadline = deadline or StepDeadline(None)

    def run(self, definition: ToolDefinition, call: ToolCall, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        left = self.deadline.remaining()
        if left is not None and left <= 0:
            self.deadline.cut = True
            return Outcome(error=f"tool {call.name} not run: {BUDGET_SPENT}")
        refused = LINGERING.refusal(definition.name, self.max_lingering)
        if refused is not None:
            TOOL_CALLS_REFUSED.labels(definition.name).inc()
            return Outcome(error=refused)
        forget = self.turn_cancel.on_set(ctx.cancelled.set) if self.turn_cancel is not None else _nothing
        # in a copy of this context, so the tool's log lines carry the step's turn_id/step/attempt
        try:
            future = _EXECUTOR.submit(contextvars.copy_context().run, _invoke, definition, args, ctx)
        except RuntimeError as exc:  # only after interpreter shutdown: nothing here ever shuts it down
            forget()
            raise ProcessExitingError(f"not running {call.name}: the process is exiting") from exc
        timeout = definition.timeout_s
        by_deadline = left is not None and (timeout is None or left < timeout)
        if by_deadline:
            timeout = left
        try:
            return Outcome(output=future.result(timeout=timeout))
        except concurrent.futures.TimeoutError:
            ctx.cancelled.set()  # the model is told it timed out: the tool must not act from now on
            LINGERING.add(definition.name)
            future.add_done_callback(lambda done: _late_result(done, call, timeout))
            if by_deadline:
                self.deadline.cut = True
                return Outcome(error=f"tool {call.name} stopped: {BUDGET_SPENT}")
            TOOL_TIMEOUTS.labels(definition.name).inc()
            return Outcome(error=f"tool {call.name} timed out after {definition.timeout_s}s")
        except Exception as exc:  # a tool's failure is the model's to read, not the turn's end
            error = self.describe(exc)
            log.warning("tool %s (call %s) raised %s", call.name, call.id, error)
            log.debug("tool %s (call %s) raised", call.name, call.id, exc_info=exc)
            return Outcome(error=error)
        finally:
            forget()

    def describe(self, exc: BaseException) -> str:
        """The exception as the model reads it: its type and its message on one line, bounded, secrets masked."""
        return describe_exception(exc, self.redact, self.error_chars)


def _nothing() -> None:
    return None


def _invoke(definition: ToolDefinition, args: dict[str, Any], ctx: ToolContext) -> Any:
    if inspect.iscoroutinefunction(definition.fn):
        return _run_coroutine(definition, args, ctx)
    return definition.invoke(args, ctx)


def _run_coroutine(definition: ToolDefinition, args: dict[str, Any], ctx: ToolContext) -> Any:
    """An async tool on a loop of its own, in the executor thread; cancelling the call cancels its task."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(definition.invoke(args, ctx))

    def cancel() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the task already ended
            loop.call_soon_threadsafe(task.cancel)

    forget = ctx.cancelled.on_set(cancel)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        raise ToolCancelledError("the tool's task was cancelled") from None
    finally:
        forget()
        loop.close()


def _late_result(future: concurrent.futures.Future[Any], call: ToolCall, timeout_s: float | None) -> None:
    """A timed-out tool that finished anyway: its thread is free again; its result never reaches the turn."""
    LINGERING.remove(call.name)
    error = future.exception()
    outcome = f"raised {type(error).__name__}" if error is not None else "returned"
    log.warning(
        "tool %s (call %s) %s after its %ss timeout was reported; its result is discarded",
        call.name,
        call.id,
        outcome,
        timeout_s,
    )
