"""A local stand-in for the Gemini API (AI Studio and Vertex) that speaks its real wire protocol.

`POST .../models/{model}:streamGenerateContent?alt=sse` answers with Server-Sent Events, one
`data: <GenerateContentResponse JSON>` per chunk, exactly as the API does; HTTP errors are JSON
bodies `{"error": {"code", "message", "status", "details"}}` with the API's statuses and headers,
and an error can also arrive as a `data:` event inside a 200 stream. Each test scripts a queue of
replies and reads back every request (path, headers, body) it received. The unmodified
`google-genai` SDK reaches it through `GOOGLE_GEMINI_BASE_URL` / `GOOGLE_VERTEX_BASE_URL`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.scripted_http import ScriptedHTTPServer


@dataclass
class SSEReply:
    """A 200 event stream. `hold_after` stops after that many events and keeps the connection open
    (a stalled upstream) until the server is released or stopped."""

    events: list[dict[str, Any]]
    hold_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ErrorReply:
    status: int
    message: str
    rpc_status: str
    headers: dict[str, str] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)


Reply = SSEReply | ErrorReply


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names; credential values replaced by "<set>"
    body: dict[str, Any]


_SECRET_HEADERS = {"x-goog-api-key", "authorization"}
_RPC_CODES = {"INVALID_ARGUMENT": 3, "NOT_FOUND": 5, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
              "INTERNAL": 13, "UNAVAILABLE": 14, "UNAUTHENTICATED": 16}  # fmt: skip


def merged_response(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole GenerateContentResponse a scripted stream adds up to (what batch mode returns for it)."""
    parts: list[dict[str, Any]] = []
    last: dict[str, Any] = {}
    for event in events:
        for candidate in event.get("candidates", []):
            parts.extend(candidate.get("content", {}).get("parts", []))
            last = {**last, **{k: v for k, v in candidate.items() if k != "content"}}
        if "usageMetadata" in event:
            last["_usage"] = event["usageMetadata"]
    usage_meta = last.pop("_usage", None)
    response: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": parts}, **last}]}
    if usage_meta is not None:
        response["usageMetadata"] = usage_meta
    return response


# --------------------------------------------------------------------------- chunk builders


def usage(
    prompt: int = 10, candidates: int = 5, cached: int | None = None, thoughts: int | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + (thoughts or 0),
    }
    if cached is not None:
        meta["cachedContentTokenCount"] = cached
    if thoughts is not None:
        meta["thoughtsTokenCount"] = thoughts
    return meta


def chunk(
    *parts: dict[str, Any], finish: str | None = None, usage_meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One streamed GenerateContentResponse with the given parts (the API omits finishReason until the end)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    event: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-fake"}
    if usage_meta is not None:
        event["usageMetadata"] = usage_meta
    return event


def text(value: str, signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"text": value}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def thought(value: str, signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"text": value, "thought": True}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def function_call(name: str, args: dict[str, Any], signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args}}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def error_event(code: int, message: str, status: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


def text_reply(*pieces: str, finish: str = "STOP", prompt: int = 10, candidates: int = 5, **usage_kw: Any) -> SSEReply:
    """Text streamed one chunk per piece; the last chunk carries finishReason and usage."""
    events = [chunk(text(p)) for p in pieces[:-1]]
    events.append(chunk(text(pieces[-1]), finish=finish, usage_meta=usage(prompt, candidates, **usage_kw)))
    return SSEReply(events)


def parts_reply(
    *parts: dict[str, Any], finish: str = "STOP", prompt: int = 10, candidates: int = 5, **usage_kw: Any
) -> SSEReply:
    """Each part in its own chunk, then a final chunk with the finish reason and usage."""
    events = [chunk(p) for p in parts]
    events.append(chunk(finish=finish, usage_meta=usage(prompt, candidates, **usage_kw)))
    return SSEReply(events)


def rate_limited(retry_after: str | None = "1", message: str = "Resource has been exhausted") -> ErrorReply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return ErrorReply(429, message, "RESOURCE_EXHAUSTED", headers)


# --------------------------------------------------------------------------- the server


class FakeGemini(ScriptedHTTPServer[Reply, RecordedRequest]):
    """Thread-per-request HTTP server on 127.0.0.1 with a scripted reply queue."""

    name = "fake Gemini"

    def __init__(self) -> None:
        super().__init__(_handler_for(self))
        # batch mode: each inlined request is answered from the reply queue when its batch is created; a batch
        # succeeds on its first get while `batches_end` is set (else when the test calls `end_batches`)
        self.batches: dict[str, dict[str, Any]] = {}
        self.batches_end = True
        self.cancelled: list[str] = []

    def end_batches(self) -> None:
        with self._cond:
            for batch in self.batches.values():
                if batch["metadata"]["state"] in ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING"):
                    batch["metadata"]["state"] = "BATCH_STATE_SUCCEEDED"


def _handler_for(fake: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_unparsed": raw.decode("utf-8", "replace")}
            headers = {k.lower(): ("<set>" if k.lower() in _SECRET_HEADERS else v) for k, v in self.headers.items()}
            if self.path.split("?")[0].endswith(":countTokens"):  # a deterministic count: 4 chars a token
                fake.add_request(RecordedRequest("POST", self.path, headers, body))
                data = json.dumps({"totalTokens": len(json.dumps(body)) // 4}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if ":batchGenerateContent" in self.path or self.path.split("?")[0].endswith(":cancel"):
                fake.add_request(RecordedRequest("POST", self.path, headers, body))
                self._batches_post(body)
                return
            reply = fake.record(RecordedRequest("POST", self.path, headers, body))
            if reply is None:
                self._error(ErrorReply(400, "fake Gemini: no scripted reply left for this request", "INVALID_ARGUMENT"))
            elif isinstance(reply, ErrorReply):
                self._error(reply)
            else:
                self._stream(reply)

        def do_GET(self) -> None:
            fake.add_request(RecordedRequest("GET", self.path, {}, {}))
            name = self.path.split("?")[0].split("/batches/")[-1]
            batch = fake.batches.get(f"batches/{name}")
            if batch is None:
                self._error(ErrorReply(404, f"fake Gemini: no batch {name}", "NOT_FOUND"))
                return
            if fake.batches_end:
                fake.end_batches()
            self._json(batch if batch["metadata"]["state"] == "BATCH_STATE_SUCCEEDED" else _without_output(batch))

        def _batches_post(self, body: dict[str, Any]) -> None:
            path = self.path.split("?")[0]
            if path.endswith(":cancel"):
                name = "batches/" + path.split("/batches/")[-1].removesuffix(":cancel")
                batch = fake.batches.get(name)
                if batch is None:
                    self._error(ErrorReply(404, "fake Gemini: no such batch", "NOT_FOUND"))
                    return
                fake.cancelled.append(name)
                batch["metadata"]["state"] = "BATCH_STATE_CANCELLED"
                batch["metadata"]["output"] = {"inlinedResponses": {"inlinedResponses": []}}
                self._json({})
                return
            requests = body["batch"]["inputConfig"]["requests"]["requests"]
            answers = []
            for request in requests:
                reply = fake.pop_reply()
                answer: dict[str, Any] = {"metadata": request.get("metadata", {})}
                if isinstance(reply, SSEReply):
                    answer["response"] = merged_response(reply.events)
                else:
                    err = reply or ErrorReply(400, "fake Gemini: no scripted reply left", "INVALID_ARGUMENT")
                    answer["error"] = {"code": _RPC_CODES.get(err.rpc_status, 2), "message": err.message}
                answers.append(answer)
            name = f"batches/fake{len(fake.batches) + 1}"
            batch = {
                "name": name,
                "metadata": {
                    "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
                    "model": path.split("/models/")[-1].split(":")[0],
                    "displayName": body["batch"].get("displayName", ""),
                    "state": "BATCH_STATE_PENDING",
                    "output": {"inlinedResponses": {"inlinedResponses": answers}},
                },
            }
            fake.batches[name] = batch
            self._json(_without_output(batch))

        def _json(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, reply: ErrorReply) -> None:
            payload: dict[str, Any] = {"code": reply.status, "message": reply.message, "status": reply.rpc_status}
            if reply.details:
                payload["details"] = reply.details
            data = json.dumps({"error": payload}).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, reply: SSEReply) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.close_connection = True
            try:
                for index, event in enumerate(reply.events):
                    if reply.hold_after is not None and index >= reply.hold_after:
                        break
                    self.wfile.write(f"data: {json.dumps(event)}\r\n\r\n".encode())
                    self.wfile.flush()
                if reply.hold_after is not None:
                    fake.release.wait(timeout=120)
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler


def _without_output(batch: dict[str, Any]) -> dict[str, Any]:
    return {**batch, "metadata": {k: v for k, v in batch["metadata"].items() if k != "output"}}
