"""A local Bedrock Runtime that speaks the real `converse-stream` wire protocol to the unmodified boto3.

Responses are `application/vnd.amazon.eventstream` frames (prelude with total and header
lengths + prelude CRC32, string headers `:event-type` / `:content-type` / `:message-type`
(and `:exception-type` for in-stream exceptions), a JSON payload, a message CRC32), one
frame per HTTP chunk. HTTP errors are JSON bodies with the `x-amzn-ErrorType` header.
Each test scripts a queue of replies and reads back every request body the server got.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import threading
import urllib.parse
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# --------------------------------------------------------------------------- framing

_STRING_HEADER = 7


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: [total][headers len][prelude crc][headers][payload][message crc]."""
    raw_headers = b""
    for name, value in headers.items():
        name_bytes, value_bytes = name.encode(), value.encode()
        raw_headers += struct.pack(">B", len(name_bytes)) + name_bytes
        raw_headers += struct.pack(">BH", _STRING_HEADER, len(value_bytes)) + value_bytes
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", binascii.crc32(body) & 0xFFFFFFFF)


def event(event_type: str, body: dict[str, Any], pad: bool = True) -> bytes:
    """A `:message-type: event` frame; real Bedrock adds a `p` padding field to each payload."""
    if pad:
        body = {**body, "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123"[: 8 + len(event_type)]}
    headers = {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, json.dumps(body).encode())


def exception(exception_type: str, message: str) -> bytes:
    """An in-stream exception frame (`throttlingException`, `modelStreamErrorException`, ...)."""
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, json.dumps({"message": message}).encode())


# --------------------------------------------------------------------------- converse-stream events


def message_start() -> list[bytes]:
    return [event("messageStart", {"role": "assistant"})]


def text_block(index: int, chunks: list[str]) -> list[bytes]:
    """A text block. Bedrock sends no contentBlockStart for text (an empty `start` union is not even
    parseable by botocore: "ContentBlockStart must have one and only one member set")."""
    frames = [event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": c}}) for c in chunks]
    return [*frames, event("contentBlockStop", {"contentBlockIndex": index})]


def tool_block(index: int, tool_id: str, name: str, args: dict[str, Any], pieces: int = 3) -> list[bytes]:
    """A toolUse block whose input JSON arrives in several string fragments."""
    raw = json.dumps(args)
    size = max(1, -(-len(raw) // pieces))
    fragments = [raw[i : i + size] for i in range(0, len(raw), size)]
    frames = [
        event(
            "contentBlockStart",
            {"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": tool_id, "name": name}}},
        )
    ]
    frames += [
        event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": f}}}) for f in fragments
    ]
    return [*frames, event("contentBlockStop", {"contentBlockIndex": index})]


def reasoning_block(index: int, chunks: list[str], signature: str) -> list[bytes]:
    frames = [
        event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"reasoningContent": {"text": c}}})
        for c in chunks
    ]
    frames.append(
        event(
            "contentBlockDelta", {"contentBlockIndex": index, "delta": {"reasoningContent": {"signature": signature}}}
        )
    )
    return [*frames, event("contentBlockStop", {"contentBlockIndex": index})]


def redacted_block(index: int, data: bytes) -> list[bytes]:
    """Redacted reasoning: a blob, base64 in the JSON payload."""
    delta = {"reasoningContent": {"redactedContent": base64.b64encode(data).decode()}}
    return [
        event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}),
        event("contentBlockStop", {"contentBlockIndex": index}),
    ]


def message_stop(reason: str) -> list[bytes]:
    return [event("messageStop", {"stopReason": reason})]


def metadata(
    input_tokens: int, output_tokens: int, cache_read: int | None = None, cache_write: int | None = None
) -> list[bytes]:
    usage: dict[str, int] = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens,
    }
    if cache_read is not None:
        usage["cacheReadInputTokens"] = cache_read
    if cache_write is not None:
        usage["cacheWriteInputTokens"] = cache_write
    return [event("metadata", {"usage": usage, "metrics": {"latencyMs": 12}})]


# --------------------------------------------------------------------------- scripted replies


@dataclass(frozen=True)
class Stall:
    """Hold the stream open, sending nothing, until the server closes."""


@dataclass
class StreamReply:
    items: Sequence[bytes | Stall]


@dataclass
class ErrorReply:
    status: int
    error_type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def turn(*blocks: list[bytes], stop: str = "end_turn", usage: tuple[int, int] = (10, 5), **cache: int) -> StreamReply:
    """A whole successful stream: messageStart, the blocks, messageStop, metadata."""
    frames: list[bytes | Stall] = [*message_start()]
    for block in blocks:
        frames.extend(block)
    frames += message_stop(stop) + metadata(*usage, cache.get("cache_read"), cache.get("cache_write"))
    return StreamReply(frames)


@dataclass
class RecordedRequest:
    path: str
    model_id: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeBedrock:
    """A ThreadingHTTPServer on 127.0.0.1:<free port>; `replies` are served in order."""

    def __init__(self) -> None:
        self.replies: deque[StreamReply | ErrorReply] = deque()
        self.requests: list[RecordedRequest] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-bedrock", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, *replies: StreamReply | ErrorReply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def next_reply(self, request: RecordedRequest) -> StreamReply | ErrorReply:
        with self._lock:
            self.requests.append(request)
            if self.replies:
                return self.replies.popleft()
        return ErrorReply(400, "ValidationException", "fake bedrock: no scripted reply left for this request")

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


def _handler_for(fake: FakeBedrock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            parts = self.path.split("/")
            if len(parts) != 4 or parts[1] != "model" or parts[3] != "converse-stream":
                self._error(ErrorReply(404, "UnknownOperationException", f"fake bedrock: unknown path {self.path}"))
                return
            recorded = RecordedRequest(
                path=self.path,
                model_id=urllib.parse.unquote(parts[2]),
                body=json.loads(raw or b"{}"),
                headers={k.lower(): v for k, v in self.headers.items()},
            )
            reply = fake.next_reply(recorded)
            if isinstance(reply, ErrorReply):
                self._error(reply)
            else:
                self._stream(reply)

        def _error(self, reply: ErrorReply) -> None:
            body = json.dumps({"message": reply.message}).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header(
                "x-amzn-ErrorType", f"{reply.error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"
            )
            self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, reply: StreamReply) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.amazon.eventstream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
            self.end_headers()
            try:
                for item in reply.items:
                    if isinstance(item, Stall):
                        fake.released.wait(60)
                        self.close_connection = True
                        return
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler
