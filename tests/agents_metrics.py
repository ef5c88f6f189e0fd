"""Agents and tools for the observability tests: a tool that raises, and a tool that logs secrets."""

from __future__ import annotations

import os

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall


@tool
def mt_boom(label: str) -> dict[str, str]:
    """Always fails (a tool error the model reads)."""
    raise RuntimeError(f"boom {label}")


@tool
def mt_leak(label: str, ctx: ToolContext) -> dict[str, str]:
    """Logs secrets the way a careless tool might: in the message and in a traceback."""
    key = os.environ.get("ANTHROPIC_API_KEY", "")
    ctx.logger.warning(
        "calling upstream for %s with x-api-key: %s, Authorization: Bearer %s, approval secret %s",
        label,
        key,
        os.environ.get("GOOGLE_API_KEY", ""),
        os.environ.get("STEPQ_APPROVAL_SECRET", ""),
    )
    try:
        raise RuntimeError(f"upstream refused {os.environ.get('AWS_SECRET_ACCESS_KEY', '')}")
    except RuntimeError:
        ctx.logger.exception("upstream call failed")
    return {"label": label}


tool_error = AgentDefinition(
    id="mt.tool_error",
    allowed_tools=["mt_boom"],
    script=[
        ScriptStep(
            text="trying the tools",
            tool_calls=[
                ScriptToolCall(name="mt_boom", args={"label": "x"}),  # raises: outcome error
                ScriptToolCall(name="mt_boom", args={"nope": 1}),  # invalid_args
                ScriptToolCall(name="mt_invented", args={}),  # not_found (labelled tool="unknown")
            ],
        ),
        ScriptStep(text="done after errors"),
    ],
)

leaky = AgentDefinition(
    id="mt.leaky",
    allowed_tools=["mt_leak"],
    script=[
        ScriptStep(text="leaking", tool_calls=[ScriptToolCall(name="mt_leak", args={"label": "a"})]),
        ScriptStep(text="done"),
    ],
)
