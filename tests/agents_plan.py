"""Agents with a visible task plan (`task_plan=True`), on the scripted and function providers."""

from __future__ import annotations

import json

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool
from stepq.providers.function import FunctionModel, FunctionRequest
from stepq.providers.scripted import ScriptStep, ScriptToolCall

PLAN = [
    {"label": "Look up the order", "status": "pending", "tool_name": "plan_lookup"},
    {"label": "Check stock", "status": "pending", "tool_name": "plan_stock"},
    {"label": "Answer", "status": "pending"},
]


@tool
def plan_lookup(order: str) -> dict[str, str]:
    """Look an order up."""
    return {"order": order, "item": "kettle"}


@tool
def plan_stock(item: str) -> dict[str, int]:
    """Count an item's stock (always fails: the warehouse is down)."""
    raise RuntimeError("warehouse unreachable")


scripted = AgentDefinition(
    id="plan.scripted",
    task_plan=True,
    allowed_tools=["plan_lookup", "plan_stock"],
    script=[
        ScriptStep(
            text="Here is my plan.",
            tool_calls=[
                ScriptToolCall(name="update_task_plan", args={"steps": PLAN}),
                ScriptToolCall(name="plan_lookup", args={"order": "42"}),
            ],
        ),
        ScriptStep(tool_calls=[ScriptToolCall(name="plan_stock", args={"item": "kettle"})]),
        ScriptStep(text="Order 42 is a kettle; stock is unknown."),
    ],
)

bad_plan = AgentDefinition(
    id="plan.bad_plan",
    task_plan=True,
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="update_task_plan", args={"steps": [{"label": "x" * 121}]})]),
        ScriptStep(text="no plan then"),
    ],
)


def _what_i_see(request: FunctionRequest) -> str:
    """Answers with what the model was shown: its tools and its system text."""
    return json.dumps({"tools": [t.name for t in request.tools], "system": request.system})


sees = AgentDefinition(
    id="plan.sees",
    task_plan=True,
    system_prompt="You help with orders.",
    allowed_tools=["plan_lookup"],
    function_model=FunctionModel(_what_i_see),
)

sees_without_plan = AgentDefinition(
    id="plan.sees_without_plan",
    system_prompt="You help with orders.",
    allowed_tools=["plan_lookup"],
    function_model=FunctionModel(_what_i_see),
)
