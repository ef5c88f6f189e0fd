"""Agents and tools for the Gemini adapter tests (the fake server plays the model)."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import tool

ODD_TOOL = "gemini_lookup/v2 order"  # not a valid Gemini function name: the adapter must sanitize and map back


@tool
def gemini_lookup(q: str) -> dict[str, str]:
    """Look something up."""
    return {"answer": f"result for {q}"}


@tool
def gemini_broken(reason: str) -> dict[str, str]:
    """A lookup whose backend is down."""
    raise RuntimeError(f"lookup backend down: {reason}")


@tool(name=ODD_TOOL, description="Look up an order (v2).")
def gemini_order_lookup(order_id: str) -> dict[str, str]:
    return {"order": order_id, "status": "shipped"}


_TOOLS = ["gemini_lookup", "gemini_broken", ODD_TOOL]

chat = AgentDefinition(
    id="gemini_t.chat",
    system_prompt="You are a test agent.",
    allowed_tools=_TOOLS,
    default_provider="gemini",
    default_model="gemini-test",
    max_output_tokens=256,
    temperature=0.2,
    loop=LoopConfig(max_steps=6),
)

thinking = AgentDefinition(
    id="gemini_t.thinking",
    system_prompt="Think first.",
    allowed_tools=_TOOLS,
    default_provider="gemini",
    default_model="gemini-test",
    provider_options={"thinking_budget": 512},
)

stall = AgentDefinition(
    id="gemini_t.stall",
    default_provider="gemini",
    default_model="gemini-test",
    # longer than any gap in a healthy reply on a loaded machine (a 0.5 s watchdog fired on those), and than
    # a cancel takes to reach the worker; the stall tests wait this long once
    provider_options={"stall_timeout_s": 5.0},
)

one_call = AgentDefinition(
    id="gemini_t.one_call",
    system_prompt="One tool at a time.",
    allowed_tools=_TOOLS,
    default_provider="gemini",
    default_model="gemini-test",
    parallel_tool_calls=False,  # Gemini has no switch for it: the engine runs only the first call
)
