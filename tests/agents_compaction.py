"""Agents for tests/test_compaction.py: a scripted turn whose tool results outgrow a small context window."""

from __future__ import annotations

from stepq.agents import AgentDefinition, LoopConfig
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.tools import tool


@tool
def cp_blob(n: int) -> str:
    """Return a long document (3,000 characters) tagged with n."""
    return f"doc-{n}:" + "z" * 3000


long_turn = AgentDefinition(
    id="cp.long_turn",
    allowed_tools=["cp_blob"],
    loop=LoopConfig(max_steps=12),
    script=[
        *[
            ScriptStep(text=f"reading {n}", tool_calls=[ScriptToolCall(id=f"b{n}", name="cp_blob", args={"n": n})])
            for n in range(8)
        ],
        ScriptStep(text="all read"),
    ],
)
