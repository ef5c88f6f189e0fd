"""MCP tools: an agent's allowlist of tools on MCP servers (streamable HTTP), each pinned to its own schema.

The schema the model is shown, and that arguments are validated against, is the one written in the agent
definition, never the server's. Before a step offers an MCP tool to the model, and again before it calls
one, the worker lists the server's tools and compares what the server advertises with the pin: a server
whose schema changed (or that no longer lists the tool) gets the tool refused, with the reason in the
step's `step-start` event and the worker's log, until someone updates the pin.

Connections never outlive a step: a step opens at most one MCP session per server, on first use, for
all its listings and calls, and closes it when the step ends (`step_scope`). The SDK's own retries are
off (no re-list-and-resend, no input-required rounds, no HTTP retries): a call that fails is the model's
to read as a tool error, like a server's `isError` result. Header values come from environment variables
read in the worker at connect time, so no secret is ever in a definition, a transcript, an event or a log.

The `mcp` SDK is the `mcp` extra, imported only when a worker talks to a server.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from stepq.agents.tools import ToolContext, ToolDefinition
from stepq.errors import DefinitionError, MissingExtraError, StepqError
from stepq.logging import redact_url

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

log = logging.getLogger("stepq.mcp")
_ANNOTATIONS = frozenset({"title", "description", "examples", "$comment"})  # not part of what a call must be
_SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class McpServer(BaseModel):
    """An MCP server spoken to over streamable HTTP. Its URL and header values may come from the environment,
    read by the worker when it connects (so secrets stay out of the definition and out of every record)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
    """How logs, events and tool errors name the server."""
    url: str | None = None
    """The server's MCP endpoint, e.g. `http://crm.internal:8931/mcp`."""
    url_env: str | None = None
    """Instead of `url`: the environment variable that holds it."""
    headers_env: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent on every request, as header name -> the environment variable holding its value
    (e.g. `{"Authorization": "CRM_MCP_AUTHORIZATION"}` with the variable set to `Bearer ...`)."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Connect, list and call timeout of one request to the server."""

    @model_validator(mode="after")
    def _one_url(self) -> McpServer:
        if (self.url is None) == (self.url_env is None):
            raise ValueError(f"MCP server {self.name}: give exactly one of url=... or url_env=...")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name}: url must be http:// or https:// (streamable HTTP)")
        return self

    @property
    def key(self) -> tuple[Any, ...]:
        """Identity within a step: one session per distinct server."""
        return (self.name, self.url, self.url_env, tuple(sorted(self.headers_env.items())), self.timeout_s)

    def endpoint(self) -> str:
        """The URL to connect to; a missing variable is a clear error (the tool call fails with it)."""
        if self.url is not None:
            return self.url
        assert self.url_env is not None
        value = os.environ.get(self.url_env, "").strip()
        if not value:
            raise McpUnavailable(f"MCP server {self.name}: set {self.url_env} to its URL on the workers")
        return value

    def headers(self) -> dict[str, str]:
        missing = [env for env in self.headers_env.values() if not os.environ.get(env)]
        if missing:
            raise McpUnavailable(f"MCP server {self.name}: set {', '.join(sorted(missing))} on the workers")
        return {header: os.environ[env] for header, env in self.headers_env.items()}


class McpTool(BaseModel):
    """One allowlisted tool of an MCP server, pinned to an explicit input schema. Mutation and approval
    policy apply exactly as for a local `@tool`: the agent's `read_only` / `mutation_policy` see
    `is_mutation` and `destructive`, and `needs_approval` gates it regardless of the policy."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)

    server: McpServer
    """Where the tool lives."""
    name: str = Field(min_length=1)
    """The tool's name on the server."""
    input_schema: dict[str, Any]
    """The pinned JSON schema of its arguments: what the model is shown and calls are validated against.
    The server's advertised schema must match it (annotations such as titles and descriptions aside)."""
    description: str = Field(min_length=1)
    """What the model is told the tool does (the server's own description is not used)."""
    alias: str | None = None
    """The name the model sees, when the server's name clashes or does not suit the provider."""
    is_mutation: bool = False
    destructive: bool = False
    needs_approval: bool | Callable[[dict[str, Any]], bool] = False
    required_features: list[str] = Field(default_factory=list)
    """Features a turn's caller must have for the model to see the tool."""
    timeout_s: float | None = 60.0
    """How long the model waits for one call (as for a local tool)."""
    _definition: McpToolDefinition | None = PrivateAttr(default=None)

    @field_validator("input_schema")
    @classmethod
    def _check_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"input_schema is not a valid JSON schema: {exc.message}") from None
        if value.get("type") != "object":
            raise ValueError('input_schema must describe an object ({"type": "object", ...}): MCP arguments are one')
        return value

    @property
    def exposed_name(self) -> str:
        return self.alias or self.name

    def definition(self) -> McpToolDefinition:
        """The tool as the engine sees it (built once): validation, policy and dispatch as for any tool."""
        if self._definition is None:
            self._definition = McpToolDefinition(
                name=self.exposed_name,
                description=self.description,
                input_schema=self.input_schema,
                fn=_never_called,
                is_mutation=self.is_mutation,
                destructive=self.destructive,
                needs_approval=self.needs_approval,
                timeout_s=self.timeout_s,
                required_features=tuple(self.required_features),
                mcp=self,
            )
        return self._definition


def check_mcp_names(agent_id: str, allowed_tools: list[str], tools: list[McpTool]) -> None:
    """Each tool the model sees has one name: an MCP tool may not shadow a local one or another MCP tool."""
    seen = set(allowed_tools)
    for t in tools:
        if t.exposed_name in seen:
            raise DefinitionError(
                f"agent {agent_id}: MCP tool {t.exposed_name!r} (server {t.server.name}) clashes with another tool "
                "of the agent; give it an alias=..."
            )
        seen.add(t.exposed_name)


def _never_called(**_: Any) -> Any:
    raise AssertionError("an MCP tool is invoked through McpToolDefinition.invoke")


@dataclass
class McpToolDefinition(ToolDefinition):
    """A ToolDefinition whose call goes to an MCP server through the step's session."""

    mcp: McpTool | None = None

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        assert self.mcp is not None
        scope = _SCOPE.get()
        if scope is not None:
            return scope.call(self.mcp, args)
        with step_scope() as own:  # outside a step (a direct call): a session of its own, closed at once
            return own.call(self.mcp, args)


class McpUnavailable(StepqError):
    """The server cannot be reached (or is not configured): the call fails, and the model reads why."""


class McpToolFailed(StepqError):
    """The server answered with `isError`, or refused the call; the message is what the model reads."""


# ---------------------------------------------------------------------------------------------- schemas


def _normalized(schema: Any, in_map: bool = False) -> Any:
    """A schema without annotations, for comparison. Inside `properties` (and the like) the keys are names,
    so a property called `title` is kept; only schema-level annotation keywords go."""
    if isinstance(schema, dict):
        if in_map:
            return {k: _normalized(v) for k, v in schema.items()}
        return {k: _normalized(v, in_map=k in _SUBSCHEMA_MAPS) for k, v in schema.items() if k not in _ANNOTATIONS}
    if isinstance(schema, list):
        return [_normalized(v) for v in schema]
    return schema


def schema_change(pinned: dict[str, Any], advertised: dict[str, Any]) -> str | None:
    """None when the server advertises the pinned schema (annotations aside), else what differs."""
    a, b = _normalized(pinned), _normalized(advertised)
    if a == b:
        return None
    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    detail = []
    props_a, props_b = a.get("properties") or {}, b.get("properties") or {}
    added = sorted(set(props_b) - set(props_a))
    removed = sorted(set(props_a) - set(props_b))
    changed = sorted(k for k in set(props_a) & set(props_b) if props_a[k] != props_b[k])
    for label, names in (("added", added), ("removed", removed), ("changed", changed)):
        if names:
            detail.append(f"{label} properties {', '.join(names)}")
    if a.get("required") != b.get("required"):
        detail.append(f"required {sorted(a.get('required') or [])} -> {sorted(b.get('required') or [])}")
    return "; ".join(detail) or f"keywords {', '.join(differing)} differ"


# ---------------------------------------------------------------------------------------------- sessions

_SCOPE: contextvars.ContextVar[StepSessions | None] = contextvars.ContextVar("stepq_mcp_scope", default=None)


@contextlib.contextmanager
def step_scope() -> Iterator[StepSessions]:
    """The MCP sessions of one step: opened on first use, all closed when the block ends. Tool calls run in
    copies of the step's context, so they find the step's sessions."""
    sessions = StepSessions()
    token = _SCOPE.set(sessions)
    try:
        yield sessions
    finally:
        _SCOPE.reset(token)
        sessions.close()


class _Connection:
    """One server's session in a step, and what it listed."""

    def __init__(self, client: Any, exit_cm: Any) -> None:
        self.client = client
        self.exit_cm = exit_cm
        self.listing: dict[str, dict[str, Any]] | None = None


class StepSessions:
    """At most one session per MCP server for one step, run on a private event loop thread (the SDK is async,
    tools and the engine are not). A server that could not be reached stays unreachable for the step: no
    second connection attempt, so a down server costs one connect per step, not one per call."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._portal_cm: Any = None
        self._portal: BlockingPortal | None = None
        self._connections: dict[tuple[Any, ...], _Connection] = {}
        self._unreachable: dict[tuple[Any, ...], str] = {}
        self._closed = False

    # -- the public operations

    def schema_problem(self, tool: McpTool) -> str | None:
        """Why the tool must not be offered (its server changed or dropped it), else None. A server that
        cannot be reached is not a schema problem: the tool stays offered and a call fails saying why."""
        try:
            listing = self._listing(tool.server)
        except McpUnavailable:
            return None
        return self._problem(tool, listing)

    def call(self, tool: McpTool, args: dict[str, Any]) -> Any:
        """Call the tool after checking the server still advertises the pinned schema; `isError` raises."""
        problem = self._problem(tool, self._listing(tool.server))
        if problem is not None:
            raise McpToolFailed(f"refused: {problem}")
        connection = self._connection(tool.server)
        portal = self._portal
        assert portal is not None
        try:
            result = portal.call(_call_tool, connection.client, tool.name, args, tool.server.timeout_s)
        except Exception as exc:
            raise McpUnavailable(
                f"MCP server {tool.server.name} failed the call to {tool.name}: {_describe(exc)}"
            ) from None
        if result.is_error:
            raise McpToolFailed(_content_text(result.content) or f"MCP tool {tool.name} reported an error")
        return _output(result)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections.values()), {}
            for connection in connections:
                with contextlib.suppress(Exception):  # a server gone mid-close must not fail the step
                    connection.exit_cm.__exit__(None, None, None)
            if self._portal_cm is not None:
                with contextlib.suppress(Exception):
                    self._portal_cm.__exit__(None, None, None)
                self._portal_cm = self._portal = None

    # -- internals

    @staticmethod
    def _problem(tool: McpTool, listing: dict[str, dict[str, Any]]) -> str | None:
        server = tool.server.name
        advertised = listing.get(tool.name)
        if advertised is None:
            return f"MCP server {server} no longer lists tool {tool.name}"
        change = schema_change(tool.input_schema, advertised)
        if change is None:
            return None
        return (
            f"MCP server {server} changed the input schema of {tool.name} ({change}); "
            "it is not trusted until the pinned input_schema in the agent definition is updated"
        )

    def _listing(self, server: McpServer) -> dict[str, dict[str, Any]]:
        connection = self._connection(server)
        with self._lock:
            if connection.listing is None:
                assert self._portal is not None
                try:
                    connection.listing = self._portal.call(_list_tools, connection.client, server.timeout_s)
                except Exception as exc:
                    reason = f"MCP server {server.name} could not list its tools: {_describe(exc)}"
                    self._unreachable[server.key] = reason
                    raise McpUnavailable(reason) from None
            return connection.listing

    def _connection(self, server: McpServer) -> _Connection:
        with self._lock:
            if self._closed:
                raise McpUnavailable(f"MCP server {server.name}: the step's sessions are closed")
            if server.key in self._unreachable:
                raise McpUnavailable(self._unreachable[server.key])
            found = self._connections.get(server.key)
            if found is not None:
                return found
            url = server.endpoint()
            headers = server.headers()
            portal = self._start_portal()
            cm = portal.wrap_async_context_manager(_connect(url, headers, server.timeout_s))
            try:
                client = cm.__enter__()
            except Exception as exc:
                reason = f"MCP server {server.name} at {redact_url(url)} is unreachable: {_describe(exc)}"
                self._unreachable[server.key] = reason
                log.warning("%s", reason)
                raise McpUnavailable(reason) from None
            connection = _Connection(client, cm)
            self._connections[server.key] = connection
            return connection

    def _start_portal(self) -> BlockingPortal:
        if self._portal is None:
            try:
                from anyio.from_thread import start_blocking_portal
            except ImportError:  # pragma: no cover - anyio comes with the mcp extra
                raise MissingExtraError("MCP tools", "mcp") from None
            self._portal_cm = start_blocking_portal()
            self._portal = self._portal_cm.__enter__()
        assert self._portal is not None
        return self._portal


def _sdk() -> Any:
    try:
        import mcp
    except ImportError:
        raise MissingExtraError("MCP tools", "mcp") from None
    return mcp


@contextlib.asynccontextmanager
async def _connect(url: str, headers: dict[str, str], timeout_s: float) -> AsyncIterator[Any]:
    """A session with the SDK's retries off: no response cache, no re-list-and-resend (calls go through the
    session, not `Client.call_tool`), no input-required rounds; httpx does not retry either."""
    _sdk()
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    timeout = httpx2.Timeout(timeout_s)
    async with create_mcp_http_client(headers=headers, timeout=timeout) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, cache=None, read_timeout_seconds=timeout_s, input_required_max_rounds=0) as client:
            yield client


async def _list_tools(client: Any, timeout_s: float) -> dict[str, dict[str, Any]]:
    import anyio

    tools: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    with anyio.fail_after(timeout_s):
        for _ in range(100):  # pages
            page = await client.list_tools(cursor=cursor)
            for t in page.tools:
                tools[t.name] = dict(t.input_schema)
            cursor = page.next_cursor
            if cursor is None:
                break
    return tools


async def _call_tool(client: Any, name: str, args: dict[str, Any], timeout_s: float) -> Any:
    import anyio

    with anyio.fail_after(timeout_s):
        return await client.session.call_tool(name, args, read_timeout_seconds=timeout_s)


def _content_text(content: list[Any]) -> str:
    return "\n".join(block.text for block in content if getattr(block, "type", None) == "text").strip()


def _output(result: Any) -> Any:
    """What the model reads: the structured result when the server gives one, else its text (or blocks)."""
    if result.structured_content is not None:
        return result.structured_content
    text = _content_text(result.content)
    if text or not result.content:
        return text
    return [block.model_dump(mode="json", exclude_none=True) for block in result.content]


def _describe(exc: BaseException) -> str:
    """The innermost cause of a failure, in one line (task groups wrap errors in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, TimeoutError) and not message:
        message = "timed out"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


# ---------------------------------------------------------------------------------------------- the engine


def offered(tools: list[ToolDefinition]) -> tuple[list[ToolDefinition], list[dict[str, str]]]:
    """The tools a step may show the model, and the MCP tools refused (name and reason). The step's
    sessions do the listing; outside a step a scope is opened for it and closed at once."""
    pinned = [t for t in tools if isinstance(t, McpToolDefinition) and t.mcp is not None]
    if not pinned:
        return tools, []
    scope = _SCOPE.get()
    with contextlib.ExitStack() as stack:
        if scope is None:
            scope = stack.enter_context(step_scope())
        refused: list[dict[str, str]] = []
        for definition in pinned:
            assert definition.mcp is not None
            reason = scope.schema_problem(definition.mcp)
            if reason is not None:
                log.warning("MCP tool %s not offered: %s", definition.name, reason)
                refused.append({"name": definition.name, "reason": reason})
    names = {r["name"] for r in refused}
    return [t for t in tools if t.name not in names], refused
