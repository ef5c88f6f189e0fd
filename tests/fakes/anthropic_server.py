"""A local stand-in for the Anthropic Messages API that speaks its real wire protocol.

It also serves Claude on Vertex AI (`…/publishers/anthropic/models/<m>:streamRawPredict`, same
SSE body) and a minimal Google OAuth token endpoint (`POST /token`) for its credentials.

`POST /v1/messages` with `"stream": true` answers with Server-Sent Events
(`event: <type>` / `data: <json>`), exactly as the API does; errors are JSON bodies
`{"type": "error", "error": {"type", "message"}}` with the API's statuses and headers.
Each test scripts a queue of replies and reads back every request body it received.
The unmodified `anthropic` SDK reaches it through `ANTHROPIC_BASE_URL`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.scripted_http import ScriptedHTTPServer


@dataclass
class SSEReply:
    """A 200 event stream. `hold_after` stops after that many events and keeps the connection open
    (a stalled upstream); `close_after` drops the connection after that many events."""

    events: list[dict[str, Any]]
    hold_after: int | None = None
    close_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ErrorReply:
    status: int
    error_type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ExpiredResult:
    """A Message Batches result of type `expired` (the request never ran)."""


Reply = SSEReply | ErrorReply | ExpiredResult


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-cased names; credential values are not kept
    body: dict[str, Any]
    received_at: float = field(default_factory=time.time)  # when the upstream saw it (rate-limit tests)
    key_sha256: str | None = (
        None  # sha256 of the credential sent (x-api-key, or a bearer token): which key, not the key
    )


# --------------------------------------------------------------------------- event builders


def message_start(
    input_tokens: int = 10, cache_read: int | None = None, cache_write: int | None = None, model: str = "claude-fake"
) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": 1,
                "cache_creation_input_tokens": cache_write,
                "cache_read_input_tokens": cache_read,
            },
        },
    }


def text_block(index: int, chunks: list[str]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": c}} for c in chunks),
        {"type": "content_block_stop", "index": index},
    ]


def thinking_block(index: int, chunks: list[str], signature: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        *(
            {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": c}}
            for c in chunks
        ),
        {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}},
        {"type": "content_block_stop", "index": index},
    ]


def redacted_thinking_block(index: int, data: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "redacted_thinking", "data": data}},
        {"type": "content_block_stop", "index": index},
    ]


def tool_use_block(index: int, tool_id: str, name: str, json_chunks: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        },
        *(
            {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": c}}
            for c in json_chunks
        ),
        {"type": "content_block_stop", "index": index},
    ]


def message_end(
    stop_reason: str | None, output_tokens: int, thinking_tokens: int | None = None
) -> list[dict[str, Any]]:
    usage: dict[str, Any] = {"output_tokens": output_tokens}
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    return [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": usage},
        {"type": "message_stop"},
    ]


def error_event(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def stream(
    *blocks: list[dict[str, Any]],
    stop_reason: str | None = "end_turn",
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int | None = None,
    cache_write: int | None = None,
    thinking_tokens: int | None = None,
) -> SSEReply:
    """A complete, well-formed message stream made of the given content blocks (with a ping, as the API sends)."""
    events = [message_start(input_tokens, cache_read, cache_write), {"type": "ping"}]
    for block in blocks:
        events.extend(block)
    events.extend(message_end(stop_reason, output_tokens, thinking_tokens))
    return SSEReply(events)


def text_reply(*chunks: str, **kwargs: Any) -> SSEReply:
    return stream(text_block(0, list(chunks)), **kwargs)


# --------------------------------------------------------------------------- the server


class FakeAnthropic(ScriptedHTTPServer[Reply, RecordedRequest]):
    """Thread-per-request HTTP server on 127.0.0.1 with a scripted reply queue."""

    name = "fake Anthropic"

    def __init__(self) -> None:
        super().__init__(_handler_for(self))
        # Message Batches: each request is answered from the reply queue when its batch is created; a batch
        # ends on its first retrieve while `batches_end` is set (else when the test calls `end_batches`)
        self.batches: dict[str, dict[str, Any]] = {}
        self.batch_results: dict[str, list[dict[str, Any]]] = {}
        self.batches_end = True
        self.cancelled: list[str] = []

    def end_batches(self) -> None:
        with self._cond:
            for batch in self.batches.values():
                _end(batch)

    def next_reply(self) -> Reply:
        reply = self.pop_reply()
        if reply is not None:
            return reply
        return ErrorReply(
            400, "invalid_request_error", "fake Anthropic server: no scripted reply left for this request"
        )


def assemble(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole `message` a scripted stream adds up to (what Message Batches return for it)."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    json_parts: dict[int, list[str]] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = json.loads(json.dumps(event["message"]))
        elif kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = block.get("signature", "") + delta["signature"]
            elif delta["type"] == "input_json_delta":
                json_parts.setdefault(event["index"], []).append(delta["partial_json"])
        elif kind == "message_delta":
            message["stop_reason"] = event["delta"].get("stop_reason")
            message["usage"]["output_tokens"] = event["usage"]["output_tokens"]
    for index, parts in json_parts.items():
        blocks[index]["input"] = json.loads("".join(parts) or "{}")
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _batch_result(reply: Reply) -> dict[str, Any]:
    if isinstance(reply, SSEReply):
        return {"type": "succeeded", "message": assemble(reply.events)}
    if isinstance(reply, ErrorReply):
        return {
            "type": "errored",
            "error": {"type": "error", "error": {"type": reply.error_type, "message": reply.message}},
        }
    return {"type": "expired"}


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _end(batch: dict[str, Any]) -> None:
    if batch["processing_status"] != "ended":
        batch["processing_status"] = "ended"
        batch["ended_at"] = _now_iso()
        batch["results_url"] = f"{batch['_base']}/v1/messages/batches/{batch['id']}/results"


_SECRET_HEADERS = frozenset({"authorization", "x-api-key"})


def count_tokens(body: dict[str, Any]) -> int:
    """What the fake's count endpoint answers: the request's JSON at 4 characters a token."""
    return len(json.dumps(body)) // 4


# the native Messages route, and Vertex AI's route for Claude (model in the path)
MESSAGES_PATH = re.compile(
    r"^/v1/messages$|^/v1/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/[^/:]+:(stream)?[rR]awPredict$"
)


def _handler_for(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the connection closes after each response: SSE bodies end with it

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_unparseable": raw.decode("utf-8", "replace")}
            headers = {k.lower(): ("<present>" if k.lower() in _SECRET_HEADERS else v) for k, v in self.headers.items()}
            fake.add_request(RecordedRequest(path=self.path, headers=headers, body=body, key_sha256=self._key_sha256()))
            if self.path == "/token":  # Google's OAuth token endpoint, for Claude on Vertex AI
                self._json(200, {"access_token": "ya29.fake-token", "expires_in": 3600, "token_type": "Bearer"})
                return
            if self.path.split("?")[0] == "/v1/messages/count_tokens":  # a deterministic count: 4 chars a token
                self._json(200, {"input_tokens": count_tokens(body)})
                return
            if self.path.startswith("/v1/messages/batches"):
                self._batches_post(body)
                return
            if not MESSAGES_PATH.match(self.path.split("?")[0]):
                self._error(ErrorReply(404, "not_found_error", f"fake Anthropic server: no route {self.path}"))
                return
            if "authorization" not in headers and "x-api-key" not in headers:
                self._error(ErrorReply(401, "authentication_error", "invalid x-api-key"))
                return
            reply = fake.next_reply()
            if isinstance(reply, ErrorReply):
                self._error(reply)
            else:
                self._stream(reply)

        def do_GET(self) -> None:
            fake.add_request(RecordedRequest(path=self.path, headers={}, body={}, key_sha256=self._key_sha256()))
            match = re.match(r"^/v1/messages/batches/([^/?]+)(/results)?", self.path)
            batch = fake.batches.get(match.group(1)) if match else None
            if batch is None:
                self._error(ErrorReply(404, "not_found_error", f"fake Anthropic server: no route {self.path}"))
                return
            if match and match.group(2):
                lines = "".join(json.dumps(r) + "\n" for r in fake.batch_results[batch["id"]]).encode()
                self.send_response(200)
                self.send_header("content-type", "application/binary")
                self.send_header("content-length", str(len(lines)))
                self.end_headers()
                self.wfile.write(lines)
                return
            if fake.batches_end:
                _end(batch)
            self._json(200, {k: v for k, v in batch.items() if not k.startswith("_")})

        def _key_sha256(self) -> str | None:
            """Which credential the request carried (x-api-key, or a bearer token), as a hash: never the key."""
            credential = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
            return hashlib.sha256(credential.encode()).hexdigest() if credential else None

        def _batches_post(self, body: dict[str, Any]) -> None:
            cancel = re.match(r"^/v1/messages/batches/([^/?]+)/cancel$", self.path)
            if cancel:
                batch = fake.batches.get(cancel.group(1))
                if batch is None:
                    self._error(ErrorReply(404, "not_found_error", "no such batch"))
                    return
                fake.cancelled.append(batch["id"])
                if batch["processing_status"] != "ended":
                    fake.batch_results[batch["id"]] = [
                        {"custom_id": r["custom_id"], "result": {"type": "canceled"}}
                        for r in fake.batch_results[batch["id"]]
                    ]
                    batch["cancel_initiated_at"] = _now_iso()
                    _end(batch)
                self._json(200, {k: v for k, v in batch.items() if not k.startswith("_")})
                return
            requests = body.get("requests") or []
            batch_id = f"msgbatch_{uuid.uuid4().hex[:16]}"
            results = [{"custom_id": r["custom_id"], "result": _batch_result(fake.next_reply())} for r in requests]
            fake.batch_results[batch_id] = results
            batch = {
                "id": batch_id,
                "type": "message_batch",
                "processing_status": "in_progress",
                "request_counts": {
                    "processing": len(requests),
                    "succeeded": 0,
                    "errored": 0,
                    "canceled": 0,
                    "expired": 0,
                },
                "ended_at": None,
                "created_at": _now_iso(),
                "expires_at": _now_iso(),
                "archived_at": None,
                "cancel_initiated_at": None,
                "results_url": None,
                "_base": fake.base_url,
            }
            fake.batches[batch_id] = batch
            self._json(200, {k: v for k, v in batch.items() if not k.startswith("_")})

        def _error(self, reply: ErrorReply) -> None:
            body = {
                "type": "error",
                "error": {"type": reply.error_type, "message": reply.message},
                "request_id": f"req_{uuid.uuid4().hex[:12]}",
            }
            self._json(reply.status, body, reply.headers)

        def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def _stream(self, reply: SSEReply) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("request-id", f"req_{uuid.uuid4().hex[:12]}")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            try:
                for n, event in enumerate(reply.events):
                    if reply.close_after is not None and n >= reply.close_after:
                        return
                    if reply.hold_after is not None and n >= reply.hold_after:
                        fake.release.wait(timeout=60)
                        return
                    frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                if reply.hold_after is not None and reply.hold_after >= len(reply.events):
                    fake.release.wait(timeout=60)
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler
