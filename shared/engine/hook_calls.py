"""The agent's lifecycle hooks (`AgentDefinition.on_step_start`, ...) as an observer of the step's lifecycle
points (engine/lifecycle.py): each hook is told its documented arguments (stepq.agents.hooks).

A hook runs in the worker thread running the step; an `async def` hook runs to its end on a loop of its
own. A raising hook is logged on `stepq.hooks` and counted in `stepq_hook_failures_total`; the turn goes
on. A hook wrapped in `fails_turn` (only the ones before the step's commit may be) fails the turn instead.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.agents.hooks import FailsTurn, ModelRequested, StepFinished, StepStarted, ToolResulted
from stepq.engine.context import Delivery, StepContext
from stepq.errors import StepqError
from stepq.fleet.metrics import HOOK_FAILURES
from stepq.models import AssistantMessage, AttemptTrace, StepTrace, ToolResult, TurnResult
from stepq.providers.base import StepRequest

log = logging.getLogger("stepq.hooks")


class HookFailedError(StepqError):
    """A hook that opted in (`fails_turn`) raised: the turn fails with this one line."""


class HookCalls:
    """Calls one agent's hooks at the lifecycle points."""

    def __init__(self, agent: AgentDefinition) -> None:
        self.agent = agent

    def step_started(self, ctx: StepContext) -> None:
        state = ctx.state
        if self.agent.on_step_start is None:
            return
        info = StepStarted(
            turn_id=state.turn_id,
            agent=state.agent,
            step=state.step,
            attempt=state.attempt,
            provider=state.provider,
            model=state.model,
            rerun=state.step_rerun,
            metadata=dict(state.metadata),
        )
        self._call(ctx, "on_step_start", self.agent.on_step_start, info)

    def model_requested(self, ctx: StepContext, request: StepRequest) -> None:
        if self.agent.on_model_request is None:
            return
        state = ctx.state
        info = ModelRequested(state.turn_id, state.agent, state.step, state.attempt, request.model_copy(deep=True))
        self._call(ctx, "on_model_request", self.agent.on_model_request, info)

    def attempt_ended(self, d: Delivery, attempt: AttemptTrace) -> None:
        return None  # no hook of its own: the attempts reach on_step_finish in its trace

    def step_finished(self, d: Delivery, trace: StepTrace, results: list[ToolResult]) -> None:
        state, agent = d.state, self.agent
        by_id = {r.tool_call_id: r for r in results}
        assistant = _assistant_of(d)
        calls = {c.id: c for c in assistant.tool_calls} if assistant is not None else {}
        if agent.on_tool_result is not None:
            for traced in trace.calls:
                result, call = by_id.get(traced.id), calls.get(traced.id)
                if result is None or call is None:
                    continue
                info = ToolResulted(state.turn_id, state.agent, trace.step, call, result, traced.duration_s)
                self._call(d, "on_tool_result", agent.on_tool_result, info)
        if agent.on_step_finish is not None:
            started = trace.started_at or time.time()
            finished = StepFinished(
                turn_id=state.turn_id,
                agent=state.agent,
                step=trace.step,
                trace=trace,
                usage=trace.usage,
                duration_s=round(max(0.0, time.time() - started), 6),
                text=assistant.text if assistant is not None else "",
                tool_results=[by_id[c.id] for c in trace.calls if c.id in by_id],
            )
            self._call(d, "on_step_finish", agent.on_step_finish, finished)

    def turn_finished(self, d: Delivery, result: TurnResult) -> str | None:
        if self.agent.on_turn_finish is None:
            return None
        follow_up = self._call(d, "on_turn_finish", self.agent.on_turn_finish, result)
        return follow_up if isinstance(follow_up, str) and follow_up.strip() else None

    def _call(self, d: Delivery, name: str, fn: Any, info: Any) -> Any:
        try:
            value = fn(info)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
            return value
        except Exception as exc:
            line = f"hook {name} of agent {self.agent.id} raised {d.describe(exc)}"
            if isinstance(fn, FailsTurn):
                raise HookFailedError(line) from exc
            HOOK_FAILURES.labels(self.agent.id, name).inc()
            log.warning("%s; the turn goes on", line)
            log.debug("hook %s raised", name, exc_info=exc)
            return None


async def _awaited(value: Any) -> Any:
    return await value


def _assistant_of(d: Delivery) -> AssistantMessage | None:
    """The committed step's answer: the last assistant message (its tool results may follow it)."""
    for message in reversed(d.state.messages[-3:]):
        if isinstance(message, AssistantMessage):
            return message
    return None
