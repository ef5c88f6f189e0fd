"""Agents and tools for client-side tool calls and edited approvals (tests/test_client_tools.py)."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, client_tool, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from tests.agents import _redis


@tool(client=True)
def ct_pick_date(question: str) -> str:
    """Ask the user to pick a date in the browser (runs at the caller)."""
    raise AssertionError("a client-side tool never runs on a worker")


ct_geolocate = client_tool(
    "ct_geolocate",
    "The user's location, from the browser.",
    input_schema={
        "type": "object",
        "properties": {"precision": {"type": "string", "enum": ["city", "exact"]}},
        "required": ["precision"],
        "additionalProperties": False,
    },
)


@tool
def ct_echo(text: str) -> dict[str, str]:
    """Echo the text back (a server-side tool)."""
    return {"echo": text}


@tool(is_mutation=True, editable=True)
def ct_refund(order_id: str, amount_eur: float, ctx: ToolContext) -> dict[str, object]:
    """Refund an order (gated; a reviewer may edit the amount). Counts executions per turn and amount."""
    count = _redis.incr(f"{ctx.metadata['prefix']}:side-effects:{ctx.turn_id}:{order_id}:{amount_eur}")
    return {"order_id": order_id, "refunded_eur": amount_eur, "count": count}


@tool(is_mutation=True)
def ct_delete(order_id: str) -> dict[str, str]:
    """Delete an order (gated; its arguments cannot be edited)."""
    return {"deleted": order_id}


browser = AgentDefinition(
    id="ct.browser",
    allowed_tools=["ct_echo", "ct_pick_date", "ct_geolocate"],
    script=[
        ScriptStep(
            text="need the user",
            tool_calls=[
                ScriptToolCall(name="ct_echo", args={"text": "server"}),
                ScriptToolCall(name="ct_pick_date", args={"question": "when?"}),
                ScriptToolCall(name="ct_geolocate", args={"precision": "city"}),
            ],
        ),
        ScriptStep(text="done", echo_messages=True),
    ],
)

bad_args = AgentDefinition(
    id="ct.bad_args",
    allowed_tools=["ct_geolocate"],
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="ct_geolocate", args={"precision": "street"})]),
        ScriptStep(text="done", echo_messages=True),
    ],
)

mixed = AgentDefinition(
    id="ct.mixed",
    allowed_tools=["ct_refund", "ct_pick_date"],
    read_only=False,
    script=[
        ScriptStep(
            tool_calls=[
                ScriptToolCall(name="ct_refund", args={"order_id": "A-1", "amount_eur": 50.0}),
                ScriptToolCall(name="ct_pick_date", args={"question": "delivery?"}),
            ]
        ),
        ScriptStep(text="done", echo_messages=True),
    ],
)

expiring = AgentDefinition(
    id="ct.expiring",
    allowed_tools=["ct_pick_date"],
    approval_ttl_s=0.5,
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="ct_pick_date", args={"question": "when?"})]),
        ScriptStep(text="done", echo_messages=True),
    ],
)

editor = AgentDefinition(
    id="ct.editor",
    allowed_tools=["ct_refund", "ct_delete"],
    read_only=False,
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="ct_refund", args={"order_id": "A-1", "amount_eur": 50.0})]),
        ScriptStep(text="done", echo_messages=True),
    ],
)

deleter = AgentDefinition(
    id="ct.deleter",
    allowed_tools=["ct_delete"],
    read_only=False,
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="ct_delete", args={"order_id": "A-1"})]),
        ScriptStep(text="done"),
    ],
)
