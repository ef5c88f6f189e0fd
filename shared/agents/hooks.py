"""Lifecycle hooks an agent's author sets on `AgentDefinition` (`on_step_start`, `on_model_request`,
`on_tool_result`, `on_step_finish`, `on_turn_finish`): what each one is told, and how one opts into failing
the turn.

The hooks run on the worker running the step (in its thread; an `async def` hook on a loop of its own).
A hook that raises is logged and counted (`stepq_hook_failures_total`) and the turn goes on, unless it is
wrapped in `fails_turn(fn)`: then the turn fails with the hook's error on one line. `on_tool_result`,
`on_step_finish` and `on_turn_finish` run once per committed step, after its fenced commit (a fenced-off
re-run never calls them); `on_step_start` and `on_model_request` run on each delivery that gets that far
(a re-run after a crash says so: `rerun=True`). See docs/operate/tracing.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepq.models import StepTrace, ToolCall, ToolResult, TurnResult, Usage
from stepq.providers.base import StepRequest


@dataclass(frozen=True)
class StepStarted:
    """`on_step_start`: a step is about to call the model (after its policies are resolved)."""

    turn_id: str
    agent: str
    step: int
    attempt: int
    provider: str
    model: str
    rerun: bool  # this step runs again: a worker stopped in the middle of it before
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRequested:
    """`on_model_request`: the final request of this attempt, after prepare_step, compaction and the policies.
    A copy: changing it changes nothing."""

    turn_id: str
    agent: str
    step: int
    attempt: int
    request: StepRequest


@dataclass(frozen=True)
class ToolResulted:
    """`on_tool_result`: one tool call of a committed step and the result the model reads."""

    turn_id: str
    agent: str
    step: int
    call: ToolCall
    result: ToolResult
    duration_s: float | None  # None: the result was not produced by running the function (stored, refused)


@dataclass(frozen=True)
class StepFinished:
    """`on_step_finish`: a step committed (it advanced the turn or ended it)."""

    turn_id: str
    agent: str
    step: int
    trace: StepTrace  # what `stepq show --trace` shows for the step: attempts, tool calls, durations
    usage: Usage  # the step's tokens (the answering attempt's)
    duration_s: float  # from the step's first delivery to its commit (an approval wait included)
    text: str  # the model's text in this step
    tool_results: list[ToolResult] = field(default_factory=list)


HookFn = Callable[[Any], Any]


@dataclass(frozen=True)
class FailsTurn:
    """A hook that opted into failing the turn when it raises (see `fails_turn`)."""

    fn: HookFn

    def __call__(self, info: Any) -> Any:
        return self.fn(info)


def fails_turn(fn: HookFn) -> FailsTurn:
    """Wrap a hook so that its exception fails the turn instead of being logged and counted."""
    return FailsTurn(fn)


HOOK_NAMES = ("on_step_start", "on_model_request", "on_tool_result", "on_step_finish", "on_turn_finish")
TurnFinishHook = Callable[[TurnResult], Any]  # may return a follow-up prompt (str) for the turn's thread
