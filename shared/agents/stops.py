"""Named stop conditions: predicates over the loop's state that an agent or a caller names.

A predicate is Python code, so it lives on the workers (registered when an agent module is
imported) and is referred to by name: `StopWhen(custom="billing.paid")` is plain JSON, which a
caller may send in `loop` overrides like any other stop condition. The engine asks every named
predicate after each tool step (after the step's tools ran); the first that answers True ends the
turn with finish reason `custom-stop`, and `stop_detail` names the predicate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stepq.errors import DefinitionError
from stepq.models import STOP_NAME, Message, ToolCall, ToolResult, Usage

NAME = STOP_NAME  # the models own the syntax: a policy's stop_when (stepq.models) checks it too


@dataclass(frozen=True)
class StopContext:
    """What a stop condition may look at: the turn so far, and the tool step that just ran."""

    turn_id: str
    agent: str
    step: int  # the step that just finished (0-based)
    usage: Usage  # the turn's tokens so far, this step included
    cost: float | None  # the turn's cost so far (when STEPQ_PRICES has the models)
    tool_calls: list[ToolCall]  # the calls of the step that just finished
    results: list[ToolResult]  # their results, in the same order
    tool_calls_made: int  # tool calls over the whole turn
    messages: list[Message]  # the transcript, the step's tool results included
    metadata: Mapping[str, Any]  # the turn's metadata (tenant, ...)


StopPredicate = Callable[[StopContext], bool]

_REGISTRY: dict[str, StopPredicate] = {}


def stop_condition(name: str) -> Callable[[StopPredicate], StopPredicate]:
    """Register `fn(StopContext) -> bool` under `name` (dotted lowercase, e.g. `billing.paid`).

    Register it in a module listed in STEPQ_AGENT_MODULES (or imported by one), so every worker has it."""
    if not isinstance(name, str) or not NAME.match(name):
        raise DefinitionError(f"stop condition name {name!r} must be dotted lowercase words, e.g. 'billing.paid'")

    def register(fn: StopPredicate) -> StopPredicate:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not fn and _origin(existing) != _origin(fn):
            raise DefinitionError(f"stop condition {name!r} is registered twice ({_origin(existing)}, {_origin(fn)})")
        _REGISTRY[name] = fn
        return fn

    return register


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def get_stop_condition(name: str) -> StopPredicate | None:
    return _REGISTRY.get(name)


def stop_condition_names() -> list[str]:
    return sorted(_REGISTRY)


def unknown_message(name: str) -> str:
    """The one-line refusal for a name nothing registered, listing what is."""
    known = ", ".join(stop_condition_names()) or "none registered"
    return (
        f"no stop condition named {name!r} is registered (known: {known}); register it with "
        "@stop_condition(name) in a module listed in STEPQ_AGENT_MODULES"
    )
