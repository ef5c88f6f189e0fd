"""MCP tools end to end: a real MCP server (the `mcp` SDK's MCPServer over streamable HTTP on uvicorn, in a
subprocess, tests/mcp_server.py) and a real Celery worker process running agents from tests/agents_mcp.py.

Covered: a successful call; the server's `isError` reaching the model as a tool error; a schema change on
the server refused (not offered, reason in `step-start` and the worker's log, a call never reaches the
server); an approval-gated MCP mutation tool (and the same tool hidden on a read-only agent); the server
down (a clear tool error, the turn completes). The bearer token the worker sends never shows up in
events, Redis or the worker's log. Sessions close with the step: the server sees no session left open.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stepq.agents.mcp import McpServer, McpTool, schema_change, step_scope
from stepq.models import EventType, ToolResultMessage, TurnStatus
from tests.conftest import REDIS_URL, ROOT, WorkerProcess

pytest.importorskip("mcp")

TOKEN = "mcp-test-token-7f3a9c1e5b"  # a secret: must never leave the worker's HTTP headers


class McpTestServer:
    """tests/mcp_server.py in a subprocess; `restart(variant)` brings it back on the same port."""

    def __init__(self, tmp: Path, variant: str = "v1") -> None:
        self.log = tmp / "calls.jsonl"
        self.log.touch()
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.start(variant)

    def start(self, variant: str) -> None:
        cmd = [sys.executable, str(ROOT / "tests" / "mcp_server.py"), variant, str(self.log), TOKEN, str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # printed once the socket listens
        assert line.startswith("port "), f"the MCP server did not start: {line!r}"
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def restart(self, variant: str) -> None:
        self.stop()
        self.start(variant)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def calls(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture
def mcp_server(tmp_path: Path) -> Iterator[McpTestServer]:
    server = McpTestServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def mcp_worker(settings, mcp_server, tmp_path, monkeypatch) -> Iterator[WorkerProcess]:
    """A worker process whose environment names the server and holds its token (as a deployment's would)."""
    monkeypatch.setenv("MCP_TEST_URL", mcp_server.url)
    monkeypatch.setenv("MCP_TEST_AUTHORIZATION", f"Bearer {TOKEN}")
    worker = WorkerProcess(settings, "mcp", beat=False, log_path=str(tmp_path / "worker.log"))
    yield worker
    worker.stop()


def _run(client, agent: str, prefix: str) -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt="go", metadata={"prefix": prefix})
    result = handle.wait(timeout=120)
    return result, list(handle.events())


def _results(client, turn_id: str) -> dict[str, Any]:
    state = client.get(turn_id)
    return {r.name: r for m in state.messages if isinstance(m, ToolResultMessage) for r in m.results}


def _of(events: list[Any], kind: EventType) -> list[Any]:
    return [e for e in events if e.type == kind]


def _assert_token_nowhere(prefix: str, events: list[Any], log: Path) -> None:
    assert all(TOKEN not in e.model_dump_json() for e in events)
    r = redis.Redis.from_url(REDIS_URL)
    for key in r.scan_iter(match=f"{prefix}:*", count=1000):
        kind = r.type(key).decode()
        dumped = r.dump(key) or b""
        assert TOKEN.encode() not in dumped, f"the token is stored under {key!r} ({kind})"
    assert TOKEN not in log.read_text(errors="replace")


def test_a_call_succeeds_and_is_error_reaches_the_model_as_a_tool_error(
    mcp_worker, mcp_server, client, prefix, tmp_path
):
    result, events = _run(client, "mcp.reader", prefix)
    assert result.status == TurnStatus.COMPLETED, result.error
    start = _of(events, EventType.STEP_START)[0]
    assert start.data["tools"] == ["crm_lookup"] and "tools_refused" not in start.data
    [tool_result] = _of(events, EventType.TOOL_RESULT)
    assert tool_result.data["is_error"] is False
    assert tool_result.data["output"] == {"customer_id": "c-1", "name": "Ada Lovelace", "tier": "gold"}
    assert "Ada Lovelace" in result.text  # the model's next step read the server's answer
    assert mcp_server.calls() == [{"tool": "crm_lookup", "args": {"customer_id": "c-1"}}]

    result, events = _run(client, "mcp.closer", prefix)
    assert result.status == TurnStatus.COMPLETED, result.error  # a tool error never ends the turn
    [tool_result] = _of(events, EventType.TOOL_RESULT)
    assert tool_result.data["is_error"] is True and tool_result.data["status"] == "failed"
    assert "account c-9 has an open balance" in tool_result.data["output"]["error"]
    stored = _results(client, result.turn_id)["crm_close_account"]
    assert stored.is_error and "open balance" in stored.output["error"]
    assert "open balance" in result.text  # what the model was sent on the next step
    assert mcp_server.calls()[-1] == {"tool": "crm_close_account", "args": {"customer_id": "c-9"}}
    _assert_token_nowhere(prefix, events, tmp_path / "worker.log")


def test_a_schema_change_on_the_server_is_refused_not_trusted(mcp_worker, mcp_server, client, prefix, tmp_path):
    result, _ = _run(client, "mcp.reader", prefix)
    assert result.status == TurnStatus.COMPLETED and len(mcp_server.calls()) == 1

    mcp_server.restart("v2")  # same URL; crm_lookup now requires a `region` too
    result, events = _run(client, "mcp.reader", prefix)
    assert result.status == TurnStatus.COMPLETED, result.error
    start = _of(events, EventType.STEP_START)[0]
    assert start.data["tools"] == []  # not offered
    [refused] = start.data["tools_refused"]
    assert refused["name"] == "crm_lookup"
    assert "changed the input schema of crm_lookup" in refused["reason"] and "region" in refused["reason"]
    # the (scripted) model calls it anyway: the call is refused by the same check and never reaches the server
    [tool_result] = _of(events, EventType.TOOL_RESULT)
    assert tool_result.data["is_error"] is True
    assert "refused: MCP server crm changed the input schema" in tool_result.data["output"]["error"]
    assert len(mcp_server.calls()) == 1
    worker_log = (tmp_path / "worker.log").read_text(errors="replace")
    assert "MCP tool crm_lookup not offered" in worker_log
    _assert_token_nowhere(prefix, events, tmp_path / "worker.log")


def test_an_mcp_mutation_tool_waits_for_approval_and_runs_once(mcp_worker, mcp_server, client, prefix):
    handle = client.submit("mcp.refunder", prompt="refund A-1", metadata={"prefix": prefix})
    request = None
    for event in handle.events(idle_timeout=120):
        if event.type == EventType.APPROVAL_REQUEST:
            request = event
            break
    assert request is not None and request.data["tool"] == "crm_refund"
    assert request.data["args"] == {"order_id": "A-1", "amount": 12.5}
    assert client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL
    assert mcp_server.calls() == []  # nothing reached the server before a person decided

    assert client.approve(request.data["approval_id"], True, reviewer="ops").wait(60)
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert mcp_server.calls() == [{"tool": "crm_refund", "args": {"order_id": "A-1", "amount": 12.5}}]
    assert _results(client, handle.turn_id)["crm_refund"].output == {"order_id": "A-1", "refunded": 12.5}

    # the same tool on a read-only agent: hidden from the model, and a call to it does not run
    result, events = _run(client, "mcp.read_only", prefix)
    assert _of(events, EventType.STEP_START)[0].data["tools"] == []
    [tool_result] = _of(events, EventType.TOOL_RESULT)
    assert tool_result.data["status"] == "not_found" and not _of(events, EventType.APPROVAL_REQUEST)
    assert len(mcp_server.calls()) == 1


def test_a_denied_mcp_mutation_never_reaches_the_server(mcp_worker, mcp_server, client, prefix):
    handle = client.submit("mcp.refunder", prompt="refund A-1", metadata={"prefix": prefix})
    request = next(e for e in handle.events(idle_timeout=120) if e.type == EventType.APPROVAL_REQUEST)
    assert client.approve(request.data["approval_id"], False, reason="not eligible").wait(60)
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED
    assert "denied by reviewer: not eligible" in result.text
    assert mcp_server.calls() == []


def test_a_server_that_is_down_is_a_clear_tool_error(mcp_worker, mcp_server, client, prefix, tmp_path):
    mcp_server.stop()
    result, events = _run(client, "mcp.reader", prefix)
    assert result.status == TurnStatus.COMPLETED, result.error  # the turn goes on without the tool
    assert _of(events, EventType.STEP_START)[0].data["tools"] == ["crm_lookup"]  # pinned: offered, unverifiable
    [tool_result] = _of(events, EventType.TOOL_RESULT)
    assert tool_result.data["is_error"] is True
    error = tool_result.data["output"]["error"]
    assert f"MCP server crm at {mcp_server.url} is unreachable: " in error
    assert "unreachable" in result.text  # the model read it
    _assert_token_nowhere(prefix, events, tmp_path / "worker.log")


# --------------------------------------------------------------------------- without a worker


def test_sessions_close_with_the_step(mcp_server, monkeypatch):
    """A step's session is one per server for all its listings and calls, and gone once the step ends."""
    monkeypatch.setenv("MCP_TEST_AUTHORIZATION", f"Bearer {TOKEN}")
    server = McpServer(name="crm", url=mcp_server.url, headers_env={"Authorization": "MCP_TEST_AUTHORIZATION"})
    pinned = {"type": "object", "properties": {"customer_id": {"type": "string"}}, "required": ["customer_id"]}
    lookup = McpTool(server=server, name="crm_lookup", input_schema=pinned, description="Look up.")
    with step_scope() as sessions:
        assert sessions.schema_problem(lookup) is None
        assert sessions.call(lookup, {"customer_id": "a"})["customer_id"] == "a"
        assert sessions.call(lookup, {"customer_id": "b"})["customer_id"] == "b"
        assert len(sessions._connections) == 1
    assert sessions._connections == {} and sessions._portal is None


def test_a_missing_token_variable_is_a_clear_error_naming_it(mcp_server, monkeypatch):
    monkeypatch.delenv("MCP_TEST_AUTHORIZATION", raising=False)
    server = McpServer(name="crm", url=mcp_server.url, headers_env={"Authorization": "MCP_TEST_AUTHORIZATION"})
    lookup = McpTool(server=server, name="crm_lookup", input_schema={"type": "object"}, description="Look up.")
    with step_scope() as sessions, pytest.raises(Exception, match="set MCP_TEST_AUTHORIZATION on the workers"):
        sessions.call(lookup, {})


def test_schema_comparison_ignores_annotations_only() -> None:
    pinned = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    advertised = {
        "type": "object",
        "title": "argsModel",
        "properties": {"title": {"type": "string", "title": "Title", "description": "the title"}},
        "required": ["title"],
    }
    assert schema_change(pinned, advertised) is None  # a property named `title` is not an annotation
    widened = {**advertised, "properties": {**advertised["properties"], "force": {"type": "boolean"}}}
    assert schema_change(pinned, widened) == "added properties force"
    retyped = {**advertised, "properties": {"title": {"type": "integer"}}}
    assert schema_change(pinned, retyped) == "changed properties title"
    assert "required" in (schema_change(pinned, {**advertised, "required": []}) or "")
