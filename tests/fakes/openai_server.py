"""A local stand-in for the OpenAI API that speaks its real wire protocol: the Responses API stream and the
Chat Completions stream, on OpenAI's routes (`/v1/responses`, `/v1/chat/completions`) and Azure
OpenAI's (`/openai/deployments/<deployment>/chat/completions?api-version=...`, `/openai/responses`).

Responses streams are Server-Sent Events with `event: <type>` / `data: <json>` (`response.created`,
`response.output_text.delta`, `response.function_call_arguments.delta`, `response.completed`, `error`...);
Chat Completions streams are `data: <chunk>` lines ending with `data: [DONE]`, an in-stream failure being a
`data: {"error": {...}}` line. Errors are JSON bodies `{"error": {"message", "type", "code"}}` with the API's
statuses and headers. Each test scripts a queue of replies and reads back every request it received; the
unmodified `openai` SDK reaches it through its base URL.
"""

from __future__ import annotations

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
    """A 200 event stream (`named`: Responses events carry `event:` lines). `close_after` drops the
    connection after that many events; `hold_after` stops after that many events and keeps the connection
    open (a stalled upstream); `done` ends a Chat Completions stream with `data: [DONE]`."""

    events: list[dict[str, Any]]
    named: bool = True
    done: bool = False
    close_after: int | None = None
    hold_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ErrorReply:
    status: int
    code: str | None
    message: str
    error_type: str = "server_error"
    headers: dict[str, str] = field(default_factory=dict)


Reply = SSEReply | ErrorReply


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-cased names; credential values are not kept
    body: dict[str, Any]
    received_at: float = field(default_factory=time.time)


# --------------------------------------------------------------------------- Responses API events


def _usage(input_tokens: int, output_tokens: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def _response(status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1_700_000_000,
        "model": "gpt-fake",
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
        **extra,
    }


def text_item(chunks: list[str], item_id: str = "msg_1") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Events of one output message streamed as `chunks`, and the finished item."""
    text = "".join(chunks)
    done = {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    added = {**done, "status": "in_progress", "content": []}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        *(
            {
                "type": "response.output_text.delta",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "delta": c,
                "logprobs": [],
            }
            for c in chunks
        ),
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    return events, done


def call_item(
    call_id: str, name: str, json_chunks: list[str], item_id: str = ""
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    item_id = item_id or f"fc_{call_id}"
    done = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": "".join(json_chunks),
        "status": "completed",
    }
    events = [
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**done, "arguments": "", "status": "in_progress"},
        },
        *(
            {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": 0, "delta": c}
            for c in json_chunks
        ),
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    return events, done


def reasoning_item(
    summary: list[str], encrypted: str, item_id: str = "rs_1"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    done = {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": "".join(summary)}],
        "encrypted_content": encrypted,
    }
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**done, "summary": []}},
        *(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": item_id,
                "output_index": 0,
                "summary_index": 0,
                "delta": c,
            }
            for c in summary
        ),
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    return events, done


def response_stream(
    *items: tuple[list[dict[str, Any]], dict[str, Any]],
    input_tokens: int = 10,
    output_tokens: int = 5,
    cached: int = 0,
    reasoning: int = 0,
    incomplete: str | None = None,
) -> SSEReply:
    """A complete Responses stream: created, the items' events, then completed (or incomplete) with usage."""
    events: list[dict[str, Any]] = [{"type": "response.created", "response": _response("in_progress", [], None)}]
    for item_events, _ in items:
        events.extend(item_events)
    usage = _usage(input_tokens, output_tokens, cached, reasoning)
    output = [done for _, done in items]
    if incomplete:
        final = _response("incomplete", output, usage, incomplete_details={"reason": incomplete})
        events.append({"type": "response.incomplete", "response": final})
    else:
        events.append({"type": "response.completed", "response": _response("completed", output, usage)})
    return SSEReply(_numbered(events))


def response_text(*chunks: str, **kwargs: Any) -> SSEReply:
    return response_stream(text_item(list(chunks)), **kwargs)


def error_event(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "param": None}


def _numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


# --------------------------------------------------------------------------- Chat Completions chunks


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "fake-model",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def chat_usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chat_stream(
    chunks: list[dict[str, Any]], finish: str = "stop", prompt: int = 10, completion: int = 5, cached: int = 0
) -> SSEReply:
    """Content chunks, a finish chunk, the usage chunk and `[DONE]`."""
    events = [chunk({"role": "assistant", "content": ""}), *chunks, chunk({}, finish)]
    events.append(chunk(None, usage=chat_usage(prompt, completion, cached)))
    return SSEReply(events, named=False, done=True)


def chat_text(*texts: str, **kwargs: Any) -> SSEReply:
    return chat_stream([chunk({"content": t}) for t in texts], **kwargs)


def chat_tool_call(call_id: str, name: str, json_chunks: list[str]) -> list[dict[str, Any]]:
    first = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    rest = [{"index": 0, "function": {"arguments": c}} for c in json_chunks]
    return [chunk({"tool_calls": [first]}), *(chunk({"tool_calls": [piece]}) for piece in rest)]


def chat_error(message: str, error_type: str = "server_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code}}


# --------------------------------------------------------------------------- the server


class FakeOpenAI(ScriptedHTTPServer[Reply, RecordedRequest]):
    name = "fake OpenAI"

    def __init__(self) -> None:
        super().__init__(_handler_for(self))

    def next_reply(self) -> Reply:
        reply = self.pop_reply()
        if reply is not None:
            return reply
        return ErrorReply(400, "invalid_request", "fake OpenAI server: no scripted reply left for this request")


_SECRET_HEADERS = frozenset({"authorization", "api-key"})
ROUTES = re.compile(r"^(/v1|/openai)?/(responses|chat/completions)$|^/openai/deployments/[^/]+/chat/completions$")


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
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
            fake.add_request(RecordedRequest(path=self.path, headers=headers, body=body))
            if not ROUTES.match(self.path.split("?")[0]):
                self._error(
                    ErrorReply(404, "not_found", f"fake OpenAI server: no route {self.path}", "invalid_request_error")
                )
                return
            if "authorization" not in headers and "api-key" not in headers:
                self._error(ErrorReply(401, "invalid_api_key", "Incorrect API key provided", "invalid_request_error"))
                return
            reply = fake.next_reply()
            if isinstance(reply, ErrorReply):
                self._error(reply)
            else:
                self._stream(reply)

        def _error(self, reply: ErrorReply) -> None:
            body = {"error": {"message": reply.message, "type": reply.error_type, "param": None, "code": reply.code}}
            payload = json.dumps(body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("x-request-id", f"req_{uuid.uuid4().hex[:12]}")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def _stream(self, reply: SSEReply) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
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
                    name = f"event: {event['type']}\n" if reply.named and "type" in event else ""
                    self.wfile.write(f"{name}data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                if reply.done:
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler
