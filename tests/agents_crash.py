"""Agents whose step raises where nothing expects it (tests/test_step_crash.py): a model whose exception
cannot be printed, a model that raises a Redis reply error (not an outage), and an adapter whose own hook
raises after a good answer. Each turn must end failed with one clear line, never stay leased and running."""

from __future__ import annotations

import os

import redis

from stepq.agents.definition import AgentDefinition
from stepq.models import AssistantMessage, StepOutput, TextPart, Usage
from stepq.providers.base import Emit, ProviderAdapter, ShouldStop, StepRequest
from stepq.providers.function import FunctionModel, FunctionRequest
from stepq.providers.registry import register_provider

SECRET_VAR = "ANTHROPIC_API_KEY"  # a secret the log redaction knows: masked in the turn's error


class UnprintableError(Exception):
    """An exception whose __str__ raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message for this exception")


def _raises_unprintable(request: FunctionRequest) -> str:
    raise UnprintableError()


def _raises_redis_reply_error(request: FunctionRequest) -> str:
    raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")


class _BuggyHookAdapter(ProviderAdapter):
    """Answers well, then its `is_malformed` hook raises (a KeyError naming a secret)."""

    name = "crash-bug"

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        return StepOutput(message=AssistantMessage(parts=[TextPart(text="an answer")]), usage=Usage(input_tokens=1))

    def is_malformed(self, output: StepOutput) -> bool:
        raise KeyError(f"no entry for key {os.environ.get(SECRET_VAR, '')}")


register_provider("crash-bug", lambda agent, model: _BuggyHookAdapter())


unprintable_model = AgentDefinition(id="crash.unprintable_model", function_model=FunctionModel(_raises_unprintable))
redis_reply_model = AgentDefinition(
    id="crash.redis_reply_model", function_model=FunctionModel(_raises_redis_reply_error)
)
buggy_hook = AgentDefinition(id="crash.buggy_hook", default_provider="crash-bug", default_model="m")
