"""The documented import path of the tool decorator (`from stepq.tools import tool`); tools live in
`stepq.agents.tools`."""

from stepq.agents.tool_paths import confined_path
from stepq.agents.tools import (
    ApprovalPredicate,
    ToolContext,
    ToolDefinition,
    client_tool,
    get_tool,
    register_tool,
    tool,
)

__all__ = [
    "ApprovalPredicate",
    "ToolContext",
    "ToolDefinition",
    "client_tool",
    "confined_path",
    "get_tool",
    "register_tool",
    "tool",
]
