"""The part every fake upstream shares: a thread-per-request HTTP server on 127.0.0.1 with a queue
of scripted replies and a record of every request it received."""

from __future__ import annotations

import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

ReplyT = TypeVar("ReplyT")
RequestT = TypeVar("RequestT")


class ScriptedHTTPServer(Generic[ReplyT, RequestT]):
    name = "fake"

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._replies: deque[ReplyT] = deque()
        self.requests: list[RequestT] = []
        self._cond = threading.Condition()
        self.release = threading.Event()  # frees held (stalled) streams
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=self.name, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Any:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def enqueue(self, *replies: ReplyT) -> None:
        with self._cond:
            self._replies.extend(replies)

    def bodies(self) -> list[dict[str, Any]]:
        with self._cond:
            return [r.body for r in self.requests]  # type: ignore[attr-defined]

    def wait_for_requests(self, count: int, timeout: float = 30.0) -> list[RequestT]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= count, timeout=timeout):
                raise TimeoutError(f"{self.name} got {len(self.requests)} requests, expected {count}")
            return list(self.requests)

    def add_request(self, request: RequestT) -> None:
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()

    def pop_reply(self) -> ReplyT | None:
        """The next scripted reply, or None when the script ran out."""
        with self._cond:
            return self._replies.popleft() if self._replies else None

    def record(self, request: RequestT) -> ReplyT | None:
        """Keep the request and hand out the next scripted reply."""
        self.add_request(request)
        return self.pop_reply()
