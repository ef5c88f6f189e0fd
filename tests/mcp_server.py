"""A real MCP server for the MCP tool tests: the `mcp` SDK's MCPServer (FastMCP) over streamable HTTP on
uvicorn, in its own process so a test can stop it (server down) or restart it with changed schemas.

    python tests/mcp_server.py VARIANT CALL_LOG TOKEN [PORT]

binds 127.0.0.1 on PORT (default: a free one) and prints `port N` once it listens. Every request must carry
`Authorization: Bearer TOKEN` (401 otherwise). Each call to a tool appends one JSON line to CALL_LOG.
VARIANT `v1` serves the schemas the test agents pin; `v2` changes `crm_lookup`'s (a new required field).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send


def build(variant: str, call_log: str) -> MCPServer:
    server = MCPServer("stepq-test-crm")

    def record(tool: str, args: dict[str, Any]) -> None:
        with open(call_log, "a") as f:
            f.write(json.dumps({"tool": tool, "args": args}) + "\n")

    if variant == "v1":

        @server.tool()
        def crm_lookup(customer_id: str) -> dict[str, Any]:
            """Look a customer up."""
            record("crm_lookup", {"customer_id": customer_id})
            return {"customer_id": customer_id, "name": "Ada Lovelace", "tier": "gold"}

    else:

        @server.tool()
        def crm_lookup(customer_id: str, region: str) -> dict[str, Any]:
            """Look a customer up (now per region)."""
            record("crm_lookup", {"customer_id": customer_id, "region": region})
            return {"customer_id": customer_id, "region": region}

    @server.tool()
    def crm_close_account(customer_id: str) -> str:
        """Close an account: always refused by this server."""
        record("crm_close_account", {"customer_id": customer_id})
        raise ToolError(f"account {customer_id} has an open balance; it cannot be closed")

    @server.tool()
    def crm_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order (a write)."""
        record("crm_refund", {"order_id": order_id, "amount": amount})
        return {"order_id": order_id, "refunded": amount}

    return server


class RequireToken:
    """Refuses a request without the expected bearer token: proves the worker sent the header."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong token"})
            return
        await self.app(scope, receive, send)


def main() -> None:
    variant, call_log, token = sys.argv[1:4]
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 0  # a restart comes back on the same port
    app = RequireToken(build(variant, call_log).streamable_http_app(), token)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    print(f"port {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
