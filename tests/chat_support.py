"""Shared by the chat tests (the Node conformance test and the browser test): a gateway on a real uvicorn
with a Redis-backed worker, credentials for this session's tenant, and a control server that releases the
`chat_wait` tool of tests/agents_chat.py."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from stepq.config.settings import Settings
from tests.agents_chat import gate_key
from tests.conftest import REDIS_URL, WorkerProcess, make_settings
from tests.gateway_support import serve

API_KEY = "k-chat-tests"  # this session's tenant, every scope
SUBMIT_ONLY_KEY = "k-chat-submit"  # the same tenant, without the approve scope
OTHER_TENANT_KEY = "k-chat-other"  # another tenant, every scope


def chat_settings(prefix: str) -> Settings:
    """The tenant is the key prefix, so the gate keys fall under the prefix the fixture cleans up."""

    def entry(key: str, tenant: str, scopes: list[str]) -> dict[str, object]:
        return {"sha256": hashlib.sha256(key.encode()).hexdigest(), "tenant": tenant, "subject": key, "scopes": scopes}

    keys = [
        entry(API_KEY, prefix, ["submit", "read", "approve"]),
        entry(SUBMIT_ONLY_KEY, prefix, ["submit", "read"]),
        entry(OTHER_TENANT_KEY, f"{prefix}-other", ["submit", "read", "approve"]),
    ]
    return make_settings(prefix, api_keys=keys, gateway_rate_limit_rpm=0, gateway_keepalive_s=1.0)


def ui_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON chunks of a UI message stream, up to `data: [DONE]`."""
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return out
            out.append(json.loads(line[6:]))
    raise AssertionError(f"the stream ended without [DONE] after {out}")


class Workers:
    """The stack's worker process; `replace` SIGKILLs it (mid-step, as a crash would) and starts another."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started = 0
        self.current = self._start()

    def _start(self) -> WorkerProcess:
        self.started += 1
        return WorkerProcess(self.settings, f"chat{self.started}", beat=True, concurrency=4)

    def replace(self) -> None:
        self.current.kill()
        self.current = self._start()

    def stop(self) -> None:
        self.current.stop()


@contextmanager
def control_server(tenant: str, workers: Workers) -> Iterator[str]:
    """POST /release/<turn_id> lets that turn's `chat_wait` return; POST /worker/kill kills the worker
    (kill -9) and starts a new one. Both answer 200 once done."""
    client = redis.Redis.from_url(REDIS_URL)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path == "/worker/kill":
                workers.replace()
            else:
                turn_id = self.path.rsplit("/", 1)[-1]
                client.rpush(gate_key(tenant, turn_id), "go")
                client.expire(gate_key(tenant, turn_id), 300)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        client.close()


@dataclass
class ChatStack:
    url: str
    control_url: str
    settings: Settings


@contextmanager
def chat_stack(prefix: str) -> Iterator[ChatStack]:
    """Worker process + gateway (real uvicorn) + gate control, all on this test's key prefix."""
    settings = chat_settings(prefix)
    workers = Workers(settings)
    try:
        with serve(settings) as served, control_server(prefix, workers) as control:
            yield ChatStack(served.url, control, settings)
    finally:
        workers.stop()
