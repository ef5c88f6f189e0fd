"""Tool dispatch for one step: validate, gate by policy, execute once, store the result.

Nothing a tool or the model does here ends the turn: an unknown tool, bad
arguments, a raising or timed-out tool all become error results the model reads.
Results are stored under (turn_id, tool_call_id) before the loop moves on, so a
re-run step reuses them instead of executing twice. A mutation tool's result is
stored as soon as it returns, and everything queued before it (the step's
checkpoint, earlier results) before it starts. A read-only tool's result rides
in a round trip the step makes anyway (the next write, the flush window, or the
commit): a crash before then may run it again, which is safe for a read-only tool.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from stepq.agents import runtime_context, task_plan
from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, ToolDefinition
from stepq.approvals import canonical_args_hash
from stepq.engine import step_plan
from stepq.engine.tool_exec import ToolExecution
from stepq.errors import ToolArgumentError
from stepq.fleet.metrics import record_tool_call
from stepq.jsonsafe import finite, non_finite_path
from stepq.models import ToolCall, ToolResult, ToolResultStatus, TurnState
from stepq.store.tool_results import ToolResultStore

log = logging.getLogger("stepq.tools")

ONE_PER_STEP = "not run: one tool call per step (parallel_tool_calls=False); call it again on its own"


def runnable(agent: AgentDefinition, calls: list[ToolCall]) -> list[ToolCall]:
    """The calls of an answer that may run: all of them, or only the first when the agent allows one per
    step (providers without a native switch, Gemini and Bedrock, may still send several)."""
    return calls if agent.parallel_tool_calls else calls[:1]


class ResultSink(Protocol):
    def store(self, result: ToolResult) -> None:
        """Queue a result's write (first stored wins); durable once `settle` returns or the step commits."""

    def settle(self) -> None:
        """Make every queued result durable now (before a tool with side effects starts)."""


@dataclass
class PreparedCall:
    call: ToolCall
    definition: ToolDefinition | None
    args: dict[str, Any] | None
    error: ToolResult | None  # set when the call cannot run (unknown tool, bad args, breaker)
    needs_approval: bool = False
    deferred: bool = False  # the turn defers every call to its caller (submit's defer_tools=True)

    @property
    def has_side_effects(self) -> bool:
        """It will run a mutation tool: running it twice would repeat the mutation."""
        d = self.definition
        return self.error is None and d is not None and (d.is_mutation or d.destructive)

    @property
    def is_client(self) -> bool:
        """A valid call the turn's caller runs (the step parks for its result): a client-side tool's, or any
        call of a deferring turn, once no approval stands in its way (engine/deferred.py)."""
        if self.error is not None or self.definition is None:
            return False
        return self.definition.client or (self.deferred and not self.needs_approval)

    @property
    def waits(self) -> bool:
        """The step parks for this call: a person's approval or a client-side result."""
        return self.needs_approval or self.is_client

    @property
    def args_hash(self) -> str:
        return canonical_args_hash(self.args or {})


class StepDispatcher:
    def __init__(
        self,
        agent: AgentDefinition,
        state: TurnState,
        results: ToolResultStore,
        sink: ResultSink,
        breaker: int | None,
        max_result_chars: int,
        execution: ToolExecution,
        timings: dict[str, tuple[float, float]] | None = None,
    ) -> None:
        self.agent = agent
        self.state = state
        self.results = results
        self.sink = sink
        self.breaker = breaker
        self.max_result_chars = max_result_chars
        self.execution = execution  # runs the functions: timeouts, cancellation, sanitised errors
        self.timings = {} if timings is None else timings  # call id -> (wall-clock start, seconds it ran)
        self.visible = {t.name: t for t in step_plan.callable_tools(agent, state)}  # this step's; hidden: cannot run

    def prepare(self, call: ToolCall, position: int = 0) -> PreparedCall:
        """Validate and gate one call; `position` is its index in the answer (one call per step runs the first)."""

        def fail(output: dict[str, Any], status: ToolResultStatus) -> PreparedCall:
            result = ToolResult(tool_call_id=call.id, name=call.name, output=output, is_error=True, status=status)
            return PreparedCall(call, None, None, result)

        if position > 0 and not self.agent.parallel_tool_calls:
            denied = ToolResultStatus.DENIED
            return fail({"error": ONE_PER_STEP, "status": denied.value}, denied)
        blocked = self._breaker_block(call)
        if blocked is not None:
            return PreparedCall(call, None, None, blocked)
        definition = self.visible.get(call.name)
        if definition is None and call.name in {t.name for t in self.agent.visible_tools(self.state.features)}:
            return fail({"error": f"Tool not available on this step: {call.name}"}, ToolResultStatus.NOT_FOUND)
        if definition is None:
            if self.breaker is not None:
                return fail(
                    {
                        "error": f'TOOL_NOT_FOUND: "{call.name}" does not exist.',
                        "status": ToolResultStatus.PERMANENTLY_FAILED.value,
                        "do_not_retry": True,
                    },
                    ToolResultStatus.NOT_FOUND,
                )
            return fail({"error": f"Tool not found: {call.name}"}, ToolResultStatus.NOT_FOUND)
        try:
            args = definition.validate(call.args)
        except ToolArgumentError as exc:
            status = ToolResultStatus.INVALID_ARGUMENTS
            return fail({"error": f"Invalid arguments for {call.name}: {exc}", "status": status.value}, status)
        needs = not definition.client and self.agent.call_needs_approval(definition, args)
        # the task-plan tool is stepq's own bookkeeping (it streams the plan), never the caller's to run
        deferred = self.state.defer_tools and definition.name != task_plan.PLAN_TOOL
        return PreparedCall(call, definition, args, None, needs_approval=needs, deferred=deferred)

    def _breaker_block(self, call: ToolCall) -> ToolResult | None:
        """The TOOL_PERMANENTLY_FAILED result once a tool has used up its strikes (`tool_failure_breaker`), else None."""
        strikes = self.state.failed_tools.get(call.name)
        if self.breaker is None or not strikes or strikes[0] < self.breaker:
            return None
        count, last = strikes
        return ToolResult(
            tool_call_id=call.id,
            name=call.name,
            is_error=True,
            status=ToolResultStatus.PERMANENTLY_FAILED,
            output={
                "error": f'TOOL_PERMANENTLY_FAILED: "{call.name}" has failed {count} times. Last error: {last}.',
                "status": ToolResultStatus.PERMANENTLY_FAILED.value,
                "do_not_retry": True,
            },
        )

    def stored(self, calls: list[ToolCall]) -> dict[str, ToolResult]:
        return self.results.get_many(self.state.turn_id, [c.id for c in calls])

    def execute(self, prepared: PreparedCall) -> ToolResult:
        """Run a validated call (or record its error) and store the result; first stored wins."""
        if prepared.error is not None:
            return self._store(prepared.error)
        assert prepared.definition is not None and prepared.args is not None
        # calls are prepared together but run in order: strikes from earlier calls of this step count too
        blocked = self._breaker_block(prepared.call)
        if blocked is not None:
            return self._store(blocked)
        if not prepared.has_side_effects:
            return self._store(self._run(prepared.definition, prepared.call, prepared.args))
        # a mutation is bracketed by durable writes: what the step queued (its checkpoint, earlier
        # results) is stored before it starts, and its own result right after it returns
        self.sink.settle()
        result = self._store(self._run(prepared.definition, prepared.call, prepared.args))
        self.sink.settle()
        return result

    def record(self, result: ToolResult) -> ToolResult:
        return self._store(result)

    def _store(self, result: ToolResult) -> ToolResult:
        """Store a freshly produced result and count it in stepq_tool_calls_total. (Only this delivery,
        holding the turn's lease, runs the step's tools, so no other result can be stored first.)"""
        record_tool_call(self.agent.id, result, known=result.name in self.visible)
        self.sink.store(result)
        return result

    def _run(self, definition: ToolDefinition, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        ctx = ToolContext(
            turn_id=self.state.turn_id,
            tool_call_id=call.id,
            idempotency_key=f"{self.state.turn_id}:{call.id}",
            metadata=self.state.metadata,
            logger=log.getChild(definition.name),
            context=runtime_context.typed(self.agent.context_schema, self.state.context),
        )
        started, clock = time.time(), time.monotonic()
        outcome = self.execution.run(definition, call, args, ctx)
        self.timings[call.id] = (round(started, 6), round(time.monotonic() - clock, 6))
        message = outcome.error
        if message is None:
            try:
                return ToolResult(tool_call_id=call.id, name=call.name, output=self._bounded(outcome.output))
            except _UnsendableResultError as exc:  # the tool ran, but what it returned cannot reach the model
                log.warning("tool %s (call %s) returned a result that cannot be sent: %s", call.name, call.id, exc)
                message = f"tool {call.name} returned {exc}"
        if self.breaker is not None:
            count, _ = self.state.failed_tools.get(call.name, (0, ""))
            self.state.failed_tools[call.name] = (count + 1, message)
        failed = ToolResultStatus.FAILED
        return ToolResult(
            tool_call_id=call.id,
            name=call.name,
            output={"error": message, "status": failed.value},
            is_error=True,
            status=failed,
        )

    def _bounded(self, output: Any) -> Any:
        """The output as the model reads it: plain JSON, cut to `max_result_chars` (a marker says how much)."""
        encoded = self._encoded(output)
        if len(encoded) <= self.max_result_chars:
            return json.loads(encoded)
        cut = len(encoded) - self.max_result_chars
        return encoded[: self.max_result_chars] + f"…[truncated {cut} chars]"

    def _encoded(self, output: Any) -> str:
        """The output as JSON text; _UnsendableResultError when it cannot be: a circular reference, nesting
        too deep, or an object whose `__str__` raises. Non-JSON objects are sent as their `str()`."""
        try:
            try:
                return json.dumps(output, default=str, allow_nan=False)
            except ValueError:  # NaN/Infinity (which JSON cannot carry) or a circular reference
                json.dumps(output, default=str)  # raises again only for the circular reference
                log.warning("a tool result held NaN/Infinity at %s; sent as a string", non_finite_path(output))
                return json.dumps(finite(output), default=str, allow_nan=False)
            except TypeError:  # keys JSON cannot carry (a tuple, an object): the whole value as text
                return json.dumps(str(output))
        except RecursionError:
            raise _UnsendableResultError("a result nested too deeply to send as JSON") from None
        except Exception as exc:  # a circular reference, or an object whose __str__ (or __repr__) raised
            if type(exc) is ValueError and exc.args == ("Circular reference detected",):
                raise _UnsendableResultError("a result that refers to itself (a circular reference)") from None
            raise _UnsendableResultError(
                f"a result that cannot be sent as JSON: {self.execution.describe(exc)}"
            ) from None


class _UnsendableResultError(ValueError):
    """A tool's return value that cannot reach the model (the model reads this as the tool's error)."""
