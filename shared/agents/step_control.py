"""Per-step control: what one step may be told (model, active tools, tool choice, output cap, sampling, extra
system text), by whom, and how the tool choices order from loosest to tightest.

Three sources shape a step, in this order:
1. the agent's static `tool_choice` / `active_tools` (every step);
2. the agent's `prepare_step(StepContext)`: overrides for that one step (code by the agent's author, so
   it may replace the static defaults, but never shows a tool the allowlist or the mutation gate hides);
3. the caller's `loop` overrides (`active_tools`, `tool_choice`): tightening only, on every step, so
   `prepare_step` can never loosen what the caller asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stepq.models import ToolCall, Usage

MODES = ("auto", "none", "required")
ReasoningEffort = Literal["minimal", "low", "medium", "high"]


@dataclass(frozen=True)
class StepContext:
    """What `prepare_step` is told before a step: where the turn is, and what the last step did."""

    step: int  # the step about to run (0-based)
    usage: Usage  # the turn's tokens so far
    last_tool_calls: list[ToolCall]  # the calls of the previous step (empty on the first step)
    turn_id: str = ""
    agent: str = ""
    provider: str = ""  # the turn's provider and model (what the step runs on unless overridden)
    model: str = ""
    cost: float | None = None  # the turn's cost so far (when STEPQ_PRICES has the models)
    tool_calls_made: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    context: Any = None  # the turn's runtime context (an instance of the agent's context_schema; None: none)


class StepOverrides(BaseModel):
    """What `prepare_step` may change for one step; unset fields keep the agent's (and caller's) values."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str | None = Field(default=None, min_length=1)
    """This step's model: `model` on the turn's provider, or `provider/model`."""
    active_tools: list[str] | None = None
    """The tools shown on this step: a subset of what the allowlist and the mutation gate let the model
    see. A name outside that is ignored (the trace records a warning): prepare_step never widens."""
    tool_choice: str | None = None
    """`auto`, `none`, `required` or a tool name (forces that tool) for this step."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """This step's cap on output tokens."""
    system: str | None = None
    """Extra system text for this step, after the agent's system prompt."""
    context: Any = None
    """A new runtime context for this step and the later ones (validated against the agent's context_schema,
    stored with the turn); None keeps the current one."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    """This step's sampling temperature (each provider's own field; Anthropic takes 0 to 1)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """This step's nucleus sampling mass."""
    reasoning_effort: ReasoningEffort | None = None
    """How hard a reasoning model thinks on this step: OpenAI's `reasoning_effort`, Gemini's thinking level."""
    thinking_budget: int | None = Field(default=None, ge=0)
    """Tokens this step may spend thinking: Anthropic's (and Claude on Bedrock's) `budget_tokens`, Gemini's
    `thinkingBudget`; 0 turns thinking off where the provider allows it."""


PrepareStep = Callable[[StepContext], "StepOverrides | Mapping[str, Any] | None"]


def check_choice(choice: str, tools: list[str]) -> str | None:
    """Why `choice` is not a tool choice over `tools`, or None when it is one."""
    if choice in MODES or choice in tools:
        return None
    shown = ", ".join(tools) or "none"
    return f"tool_choice {choice!r} is neither auto, none, required nor one of the tools shown ({shown})"


def at_most(choice: str | None, limit: str | None) -> bool:
    """Whether `choice` is as tight as `limit` or tighter: auto < required < a named tool; auto < none."""
    choice, limit = choice or "auto", limit or "auto"
    if limit == "auto" or choice == limit:
        return True
    return limit == "required" and choice not in MODES


def tightest(first: str | None, second: str | None) -> str | None:
    """The tighter of two choices, or None when neither is within the other (e.g. `none` and `required`)."""
    if at_most(first, second):
        return first or second
    if at_most(second, first):
        return second or first
    return None
