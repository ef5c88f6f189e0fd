"""The runtime context of a turn: typed data the caller gives at submit that its tools (and prepare_step)
read, and the `prepare_call` hook that shapes a turn once before its first step.

An agent declares `context_schema` (a pydantic model); a submit's `context=` is validated against it before
anything is stored (one line naming the field), kept with the turn as JSON, and handed to every tool as
`ctx.context` (an instance of the schema) and to `prepare_step` as `StepContext.context`. `prepare_step` may
return an updated `context`: validated the same way, it is stored with the step's commit and is what the later
steps and their tools see. The context never reaches the model unless a tool returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stepq.errors import ContextError
from stepq.jsonsafe import caller_json_problem


def check_context(agent_id: str, schema: type[BaseModel] | None, value: Any, where: str = "context") -> dict[str, Any]:
    """`value` validated against `schema` (a JSON object when the agent declares none), as stored JSON."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if not isinstance(value, Mapping):
        raise ContextError(f"{where} must be a JSON object, not {type(value).__name__}")
    given = dict(value)
    if schema is None:
        problem = caller_json_problem(given, where)
        if problem:
            raise ContextError(problem)
        return given
    try:
        return schema.model_validate(given).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ContextError(
            f"{where} does not match agent {agent_id}'s context_schema: {first['msg']} at {loc}"
        ) from None


def typed(schema: type[BaseModel] | None, stored: dict[str, Any] | None) -> Any:
    """The stored context as a tool reads it: an instance of the schema (a dict without one; None: none given)."""
    if stored is None:
        return None
    return schema.model_validate(stored) if schema is not None else dict(stored)


@dataclass(frozen=True)
class CallContext:
    """What `prepare_call` is told, once, before a turn's first step."""

    turn_id: str
    agent: str
    provider: str  # the turn's provider and model as submitted
    model: str
    context: Any  # the submit's context (an instance of context_schema; None when none was given)
    metadata: Mapping[str, Any] = field(default_factory=dict)


class CallOverrides(BaseModel):
    """What `prepare_call` may set for the whole turn; unset fields keep the submit's values."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, arbitrary_types_allowed=True)

    model: str | None = Field(default=None, min_length=1)
    """The turn's model: `model` on the turn's provider, or `provider/model` (policies' allowlists still apply)."""
    instructions: str | None = None
    """Extra system text for every step of the turn, after the agent's prompt."""
    context: Any = None
    """The context the steps and tools see from the first step on (validated like the submit's)."""


PrepareCall = Callable[[CallContext], "CallOverrides | Mapping[str, Any] | None"]
