"""An httpx2 transport that sends the SDKs' requests from the process's provider loop, parsed by llhttp.

The official SDKs keep making every request (auth, base URL, headers, retries off, status errors, their
own exception types); only the bytes move differently. A request is written and its response parsed on
`stepq.io_loop`'s event loop (asyncio Protocol + httptools, the C parser uvicorn uses), and the body is either
read by the calling thread (`LoopBody` is an ordinary httpx2 byte stream) or, for a streamed model call,
*pumped*: `LoopBody.pump` runs the adapter's SSE reader on the loop itself, chunk by chunk, while the
step's thread only waits for the end. That takes httpx's per-chunk layers and a thread wake-up per delta
out of every streamed delta (docs/contributing/stream-decoding.md has the measurements).

Kept as httpx does it: HTTP/1.1 keep-alive per origin (an idle connection the server closed is never
reused, and a reused one that fails before any response byte is retried once on a new one), the
request's `timeout` extension (connect; read = no byte for that long, the stepq stall watchdog),
`Content-Encoding` undone by httpx2's `Response` (the raw bytes are what the stream yields), bodies
framed by length, chunks or the connection's end, TLS verified against httpx2's default context.
With a proxy in the environment (`HTTPS_PROXY` & co) the SDKs keep their own client: httpx2 mounts proxy
transports only for a client without a transport of its own. Under gevent (no provider loop) every
request goes through httpx2's own transport.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import ssl
import threading
import time
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

import httptools
import httpx2

from stepq import io_loop

Origin = tuple[str, str, int]  # scheme, host, port
_IDLE_PER_ORIGIN = 100  # as the SDKs' default keep-alive limit
_NO_BODY_STATUS = frozenset({204, 304})
_BODY_EXTENSION = "stepq.loop_body"


class _End:
    """The body's end marker in a thread-read body's queue."""


_END = _End()


class LoopBody(httpx2.SyncByteStream):
    """A response body arriving on the provider loop: iterated by a thread, or pumped through a reader."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._queue: SimpleQueue[bytes | _End | BaseException] = SimpleQueue()
        self._feed: Callable[[bytes], bool] | None = None  # pump mode: the reader, called on the loop
        self._end: Callable[[], bool] | None = None
        self._waiter: concurrent.futures.Future[bool] | None = None
        self.complete = False  # the whole body arrived (the connection may be reused)

    # -- the loop's side

    def deliver(self, chunk: bytes) -> None:
        feed = self._feed
        if feed is None:
            self._queue.put(chunk)
            return
        try:
            stop = feed(chunk)
        except BaseException as exc:  # the reader's own error (an in-stream error event, bad JSON)
            self._settle(exc)
            self._conn.abort()
            return
        if stop:  # the step stopped reading (cancelled, lease lost, deadline)
            self._settle(True)
            self._conn.abort()

    def finish(self) -> None:
        self.complete = True
        end = self._end
        if end is None:
            self._queue.put(_END)
            return
        try:
            self._settle(end())
        except BaseException as exc:
            self._settle(exc)

    def fail(self, exc: BaseException) -> None:
        if self._feed is None:
            self._queue.put(exc)
        else:
            self._settle(exc)

    def _settle(self, outcome: bool | BaseException) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        self._feed = self._end = lambda *_: True  # chunks the parser still holds are ignored
        if isinstance(outcome, BaseException):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)

    def _attach(self, feed: Callable[[bytes], bool], end: Callable[[], bool]) -> None:
        """On the loop: what arrived before the pump started goes through the reader first, in order."""
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, _End):
                self._end = end
                self._settle(end())
                return
            if isinstance(item, BaseException):
                self._settle(item)
                return
            try:
                if feed(item):
                    self._settle(True)
                    self._conn.abort()
                    return
            except BaseException as exc:
                self._settle(exc)
                self._conn.abort()
                return
        self._feed, self._end = feed, end

    # -- the calling thread's side

    def pump(self, feed: Callable[[bytes], bool], end: Callable[[], bool]) -> bool:
        """Run `feed(chunk)` on the loop for every chunk, then `end()`; either returns True to stop. Blocks the
        calling thread until then and returns that answer (or raises what the reader or the read raised).

        What already arrived (a stream's first events come with its headers) is read here first, by the
        calling thread: the step's first delta goes out from its own thread at once, not after a hand-over to
        the loop and from there to the flush timer's thread (two wake-ups on the way to a first chunk)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except Empty:
                break
            if isinstance(item, _End):
                return end()
            if isinstance(item, BaseException):
                raise item
            if feed(item):
                return True  # the caller closes the response: a body not read to its end drops the connection
        waiter: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._waiter = waiter

        def attach() -> None:
            try:
                self._attach(feed, end)
            except BaseException as exc:
                self._settle(exc)

        self._conn.loop.call_soon_threadsafe(attach)
        return waiter.result()

    def __iter__(self) -> Any:
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        if not self.complete:  # read only in part: the connection cannot carry another response
            self._conn.loop.call_soon_threadsafe(self._conn.abort)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a request at a time, its response parsed by llhttp as bytes arrive."""

    def __init__(self, pool: _Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.request: httpx2.Request | None = None
        self.head: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: LoopBody | None = None
        self.until_close = False  # the body ends with the connection (no length, not chunked)
        self.got_bytes = False
        self.last_read = 0.0
        self.watching = 0  # the request whose read timeout is armed (0: none)
        self.requests = 0

    # -- asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx2.RemoteProtocolError(f"malformed HTTP response: {exc}", request=self.request))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        body = self.body
        if self.head is not None and not self.head.done():
            self._fail(
                httpx2.RemoteProtocolError("Server disconnected without sending a response.", request=self.request)
            )
        elif body is not None and not body.complete:
            if self.until_close and exc is None:
                self.on_message_complete()
            else:
                self._fail(
                    httpx2.RemoteProtocolError(
                        "peer closed connection without sending complete message body", request=self.request
                    )
                )

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes | None) -> None:
        self.headers.append((name, value or b""))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        lowered = [(name.lower(), value) for name, value in self.headers]
        names = {name for name, _ in lowered}
        chunked = any(n == b"transfer-encoding" and b"chunked" in v.lower() for n, v in lowered)
        self.until_close = b"content-length" not in names and not chunked and self.status not in _NO_BODY_STATUS
        self.body = LoopBody(self)
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.body is not None:
            self.body.deliver(body)

    def on_message_complete(self) -> None:
        body = self.body
        if body is None or body.complete:
            return
        self.watching = 0
        keep = not self.closed and not self.until_close and self.parser.should_keep_alive()
        body.finish()
        if keep:
            self.pool.release(self)
        else:
            self.abort()

    # -- ours

    def start(self, request: httpx2.Request, head: bytes, content: bytes, read_timeout: float | None) -> None:
        """Write one request; `self.head` resolves when its response's headers are in."""
        self.request = request
        self.head = self.loop.create_future()
        self.status, self.headers, self.body, self.got_bytes = 0, [], None, False
        self.last_read = time.monotonic()
        self.requests += 1
        self.watching = self.requests if read_timeout is not None else 0
        if read_timeout is not None:
            self.loop.call_later(read_timeout, self._watch, self.requests, read_timeout)
        assert self.transport is not None
        self.transport.write(head + content)

    def _watch(self, request: int, timeout: float) -> None:
        """The read timeout: no byte for `timeout` seconds while a response is due fails it. One timer per
        request, re-armed for what is left (not reset per chunk: a chunk only stores its time)."""
        if self.watching != request or self.closed:
            return  # that response ended
        idle = time.monotonic() - self.last_read
        if idle < timeout:
            self.loop.call_later(timeout - idle, self._watch, request, timeout)
            return
        self._fail(httpx2.ReadTimeout("The read operation timed out", request=self.request))
        self.abort()

    def _fail(self, exc: Exception) -> None:
        self.watching = 0
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        elif self.body is not None and not self.body.complete:
            self.body.fail(exc)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()


class _Pool:
    """Idle keep-alive connections per origin, on one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.idle: dict[Origin, list[_Connection]] = {}

    def release(self, conn: _Connection) -> None:
        idle = self.idle.setdefault(conn.origin, [])
        if len(idle) < _IDLE_PER_ORIGIN:
            conn.request = conn.head = None
            idle.append(conn)
        else:
            conn.abort()

    def forget(self, conn: _Connection) -> None:
        idle = self.idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    async def send(
        self,
        request: httpx2.Request,
        origin: Origin,
        head: bytes,
        content: bytes,
        timeouts: dict[str, Any],
        tls: ssl.SSLContext | None,
    ) -> _Connection:
        for attempt in (0, 1):
            idle = self.idle.get(origin)
            conn = idle.pop() if idle else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(request, origin, timeouts.get("connect"), tls)
            conn.start(request, head, content, timeouts.get("read"))
            assert conn.head is not None
            try:
                await conn.head
            except (httpx2.RemoteProtocolError, httpx2.ReadError):
                if reused and not conn.got_bytes and attempt == 0:
                    continue  # the server closed the idle connection as we wrote: once more on a new one
                raise
            return conn
        raise AssertionError("unreachable")

    async def _connect(
        self, request: httpx2.Request, origin: Origin, timeout: float | None, context: ssl.SSLContext | None
    ) -> _Connection:
        _, host, port = origin
        try:
            async with asyncio.timeout(timeout):  # not wait_for, which on 3.11 can swallow the step's cancellation
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self, origin),
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context else None,
                )
        except TimeoutError as exc:
            raise httpx2.ConnectTimeout("The connect operation timed out", request=request) from exc
        except OSError as exc:
            raise httpx2.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return conn


_DEFAULT_PORTS = {"http": 80, "https": 443}
_pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
_pools_lock = threading.Lock()


def _pool(loop: asyncio.AbstractEventLoop) -> _Pool:
    pool = _pools.get(loop)
    if pool is None:
        with _pools_lock:
            pool = _pools.setdefault(loop, _Pool(loop))
    return pool


def _head(request: httpx2.Request, content: bytes) -> bytes:
    lines = [request.method.encode() + b" " + request.url.raw_path + b" HTTP/1.1"]
    has_length = False
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered == b"content-length":
            has_length = True
        elif lowered == b"transfer-encoding":
            continue  # the body was read whole: it goes with a length
        lines.append(name + b": " + value)
    if not has_length and (content or request.method not in ("GET", "HEAD")):
        lines.append(b"Content-Length: " + str(len(content)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


class LoopTransport(httpx2.BaseTransport):
    """The SDK clients' transport in a worker: requests go out from the provider loop (see the module doc)."""

    def __init__(self) -> None:
        self._fallback: httpx2.HTTPTransport | None = None
        self._tls: ssl.SSLContext | None = None  # made at the first https request (it reads SSL_CERT_FILE & co)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()
        return self._tls

    def _blocking(self) -> httpx2.HTTPTransport:
        if self._fallback is None:
            # the SDKs' own limits (httpx2's default of 100 connections would queue a gevent worker's streams)
            self._fallback = httpx2.HTTPTransport(
                limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
            )
        return self._fallback

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        scheme = request.url.scheme
        # a HEAD's response has a length but no body, which a response parser cannot know: httpx2's own
        loop = io_loop.running() if scheme in _DEFAULT_PORTS and request.method != "HEAD" else None
        if loop is None or io_loop.in_loop_thread():
            return self._blocking().handle_request(request)
        content = request.read()
        origin = (scheme, request.url.host, request.url.port or _DEFAULT_PORTS[scheme])
        timeouts = request.extensions.get("timeout") or {}
        sent = asyncio.run_coroutine_threadsafe(
            _pool(loop).send(
                request,
                origin,
                _head(request, content),
                content,
                timeouts,
                self._tls_context() if scheme == "https" else None,
            ),
            loop,
        )
        conn = sent.result()
        assert conn.body is not None
        return httpx2.Response(
            conn.status,
            headers=conn.headers,
            stream=conn.body,
            # the client wraps the stream (to time it); the extension keeps the body itself reachable for `pumpable`
            extensions={"http_version": b"HTTP/1.1", _BODY_EXTENSION: conn.body},
        )

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()


def pumpable(http_response: Any) -> LoopBody | None:
    """The response's body when it arrives on the provider loop undecoded, so a reader can run there."""
    stream = getattr(http_response, "extensions", {}).get(_BODY_EXTENSION)
    if not isinstance(stream, LoopBody):
        return None
    encoding = http_response.headers.get("content-encoding", "identity").strip().lower()
    return stream if encoding in ("", "identity") else None


_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def loop_client(default_client: Callable[..., Any]) -> Any:
    """An SDK's `DefaultHttpxClient` (its timeouts and redirects) whose requests go out through
    `LoopTransport`; under gevent, or with a proxy in the environment, the SDK's own client unchanged (httpx2 reads proxies
    from the environment only for a client without a transport of its own)."""
    if io_loop.gevent_patched() or any(os.environ.get(name) or os.environ.get(name.lower()) for name in _PROXY_VARS):
        return default_client()  # gevent: no provider loop; the SDK's client keeps its own pool limits
    return default_client(transport=LoopTransport())
