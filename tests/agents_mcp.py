"""Agents with MCP tools (tests/test_mcp_tools.py) and with feature-gated tools (tests/test_tool_features.py).

The MCP server's URL and its bearer token come from the environment of the worker that connects
(`MCP_TEST_URL`, `MCP_TEST_AUTHORIZATION`), as a deployment would give them; the schemas are pinned here.
"""

from __future__ import annotations

from stepq import AgentDefinition, McpServer, McpTool, ScriptStep, ScriptToolCall, tool

crm = McpServer(name="crm", url_env="MCP_TEST_URL", headers_env={"Authorization": "MCP_TEST_AUTHORIZATION"})
CUSTOMER = {"type": "object", "properties": {"customer_id": {"type": "string"}}, "required": ["customer_id"]}

crm_lookup = McpTool(server=crm, name="crm_lookup", input_schema=CUSTOMER, description="Look a customer up by id.")
crm_close_account = McpTool(
    server=crm, name="crm_close_account", input_schema=CUSTOMER, description="Close a customer's account."
)
crm_refund = McpTool(
    server=crm,
    name="crm_refund",
    description="Refund an order (a write).",
    input_schema={
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["order_id", "amount"],
    },
    is_mutation=True,
)

mcp_reader = AgentDefinition(
    id="mcp.reader",
    mcp_tools=[crm_lookup],
    script=[
        ScriptStep(echo_tools=True, tool_calls=[ScriptToolCall(name="crm_lookup", args={"customer_id": "c-1"})]),
        ScriptStep(echo_messages=True, text="done"),
    ],
)

mcp_closer = AgentDefinition(
    id="mcp.closer",
    mcp_tools=[crm_close_account],
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="crm_close_account", args={"customer_id": "c-9"})]),
        ScriptStep(echo_messages=True, text="could not close"),
    ],
)

mcp_refunder = AgentDefinition(
    id="mcp.refunder",
    mcp_tools=[crm_refund],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="crm_refund", args={"order_id": "A-1", "amount": 12.5})]),
        ScriptStep(echo_messages=True, text="refunded"),
    ],
)

mcp_read_only = AgentDefinition(  # the same write tool on a read-only agent: never shown, never run
    id="mcp.read_only",
    mcp_tools=[crm_refund],
    script=[
        ScriptStep(
            echo_tools=True, tool_calls=[ScriptToolCall(name="crm_refund", args={"order_id": "A-1", "amount": 1})]
        ),
        ScriptStep(text="no"),
    ],
)


# --------------------------------------------------------------------------- per-tool required features


@tool(required_features=["orders.view"])
def feat_orders(order_id: str) -> dict[str, str]:
    """Look an order up (callers need the orders.view feature)."""
    return {"order_id": order_id, "status": "shipped"}


@tool
def feat_echo(text: str) -> dict[str, str]:
    """Echo the text back."""
    return {"echo": text}


feat_agent = AgentDefinition(
    id="feat.orders",
    allowed_tools=["feat_orders", "feat_echo"],
    mcp_tools=[
        McpTool(
            server=crm,
            name="crm_lookup",
            input_schema=CUSTOMER,
            description="Look a customer up by id.",
            required_features=["crm.view"],
        )
    ],
    script=[
        ScriptStep(echo_tools=True, tool_calls=[ScriptToolCall(name="feat_orders", args={"order_id": "A-7"})]),
        ScriptStep(text="done"),
    ],
)
