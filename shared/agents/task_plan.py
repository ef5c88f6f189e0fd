"""Visible task plans: the short, user-facing list of steps an agent says it will take.

An agent with `task_plan=True` is shown one extra read-only tool, `update_task_plan`, and its
instructions gain a paragraph telling the model to state its plan with it before domain tools. The
plan is progress UI, not reasoning: labels are short and bounded. A row that names the tool it maps
to (`tool_name`) moves from pending to running to done (or failed) as that tool's calls stream, so a
chat shows the plan advancing without the model calling the plan tool again. Every change is a
`plan-update` event carrying the whole plan, and the plan is stored with the turn.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stepq.agents.tools import ToolDefinition
from stepq.models import PlanStatus, PlanStep, ToolCall, ToolResult

PLAN_TOOL = "update_task_plan"
MAX_PLAN_STEPS = 20

PLAN_GUIDANCE = (
    "Before you call other tools on a turn that needs them, call `update_task_plan` with the short list of "
    "steps you will take, and call it again when the plan changes. The plan is shown to the user as "
    "progress: keep each label short and user-facing (a few words), never put reasoning, scratch notes or "
    "tags in it. When a step maps to one tool, set its `tool_name`, and the runtime marks it running and "
    "done as that tool runs."
)


class _PlanArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[PlanStep] = Field(min_length=1, max_length=MAX_PLAN_STEPS)


def _update_task_plan(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool's own result: the model learns the plan was taken. The engine stores and streams it."""
    return {"ok": True, "steps": len(steps)}


# Written out flat (no $defs): every provider's tool-schema dialect takes it as is.
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_PLAN_STEPS,
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "description": "a few user-facing words", "maxLength": 120},
                    "status": {"type": "string", "enum": [s.value for s in PlanStatus]},
                    "tool_name": {"type": "string", "description": "the tool this step runs, if one"},
                },
                "required": ["label", "status"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["steps"],
    "additionalProperties": False,
}


@functools.cache
def plan_tool() -> ToolDefinition:
    """The plan tool as the model sees it: read-only, never gated, in no registry (agents opt in)."""
    return ToolDefinition(
        name=PLAN_TOOL,
        description="Show the user the short plan of steps you are taking on this turn; call again when it changes.",
        input_schema=_SCHEMA,
        fn=_update_task_plan,
        args_model=_PlanArgs,
        timeout_s=None,
    )


def validated_plan(args: dict[str, Any]) -> list[PlanStep]:
    """The plan a call of the plan tool sets (its arguments were validated before it ran)."""
    return _PlanArgs.model_validate(args).steps


def mark_running(plan: list[PlanStep] | None, calls: Iterable[ToolCall]) -> list[PlanStep] | None:
    """The plan with each called tool's first open row running; None when nothing changed."""
    if not plan:
        return None
    updated = [s.model_copy() for s in plan]
    changed = False
    for call in calls:
        row = _open_row(updated, call.name, (PlanStatus.PENDING,))
        if row is not None:
            row.status = PlanStatus.RUNNING
            changed = True
    return updated if changed else None


def after_results(
    plan: list[PlanStep] | None, calls: Iterable[ToolCall], results: dict[str, ToolResult]
) -> list[PlanStep] | None:
    """The plan after a step's results: a plan-tool call replaces it, other tools close their rows.

    None when nothing changed. Calls are taken in the model's order, so a plan set in the same step
    as the tools it names is advanced by them."""
    updated = [s.model_copy() for s in plan] if plan else []
    changed = False
    for call in calls:
        result = results.get(call.id)
        if result is None:
            continue
        if call.name == PLAN_TOOL:
            if not result.is_error:
                updated = validated_plan(call.args)
                changed = True
            continue
        row = _open_row(updated, call.name, (PlanStatus.RUNNING, PlanStatus.PENDING))
        if row is not None:
            row.status = PlanStatus.FAILED if result.is_error else PlanStatus.DONE
            changed = True
    return updated if changed else None


def _open_row(plan: list[PlanStep], tool_name: str, statuses: tuple[PlanStatus, ...]) -> PlanStep | None:
    for status in statuses:
        for row in plan:
            if row.tool_name == tool_name and row.status == status:
                return row
    return None


def event_data(plan: list[PlanStep]) -> dict[str, Any]:
    """The `plan-update` event's data: the whole plan, so a late subscriber needs no history."""
    return {"steps": [s.model_dump(exclude_none=True) for s in plan]}
