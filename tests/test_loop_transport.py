"""The provider loop's HTTP transport (`stepq.providers.loop_transport`) against real sockets: keep-alive and
its one retry, the read timeout, pumped bodies (the reader on the loop thread, stop, errors), bodies framed
by the connection's end, Content-Encoding, verified TLS, a forked child and gevent.

The servers here are raw sockets on 127.0.0.1 so each test decides exactly what the peer does on the wire
(the provider tests drive the same transport through the official SDKs against the wire fakes)."""

from __future__ import annotations

import datetime
import gzip
import multiprocessing
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from stepq import io_loop
from stepq.providers.loop_transport import LoopTransport, pumpable
from tests.conftest import eventually

Handler = Callable[[socket.socket, int], None]  # (the accepted connection, its index)


class RawServer:
    """Accepts connections on 127.0.0.1 and runs `handler` on each in a thread of its own."""

    def __init__(self, handler: Handler, wrap: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.wrap = wrap
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.release = threading.Event()  # frees a handler that holds its connection open
        self.closed_by_peer = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{'https' if self.wrap else 'http'}://{'localhost' if self.wrap else '127.0.0.1'}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            index = self.connections
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        try:
            if self.wrap is not None:
                conn = self.wrap.wrap_socket(conn, server_side=True)
            self.handler(conn, index)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.release.set()
        self.sock.close()


def read_request(conn: socket.socket) -> bytes | None:
    """One request's head and body (by Content-Length); None when the client closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def sized(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler, wrap: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(handler, wrap)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def client(**options: Any) -> httpx2.Client:
    return httpx2.Client(transport=LoopTransport(), **options)


def keep_alive(conn: socket.socket, index: int) -> None:
    """Answers every request on the connection, naming the connection and the request's path."""
    while (request := read_request(conn)) is not None:
        path = request.split(b" ")[1]
        conn.sendall(sized(b"conn %d %s" % (index, path)))


def test_requests_share_one_keep_alive_connection(serve):
    server = serve(keep_alive)
    with client() as http:
        answers = [http.post(f"{server.url}/r{i}", content=b'{"n": 1}').text for i in range(3)]
    assert answers == ["conn 0 /r0", "conn 0 /r1", "conn 0 /r2"]
    assert server.connections == 1


def test_a_reused_connection_the_server_dropped_is_retried_once_on_a_new_one(serve):
    """The server answers one request per connection and drops the connection when a second one arrives
    (as a server that timed the idle connection out does): the client sees one answer per request."""

    def one_per_connection(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(sized(b"conn %d" % index))
        read_request(conn)  # the reused connection's request: dropped unanswered

    server = serve(one_per_connection)
    with client() as http:
        first = http.get(f"{server.url}/a").text
        second = http.get(f"{server.url}/b").text
    assert (first, second) == ("conn 0", "conn 1")
    assert server.connections == 2


def test_a_server_that_drops_a_new_connection_fails_the_request(serve):
    """The retry is only for a reused connection: a fresh one that gets no answer is the server's failure."""
    server = serve(lambda conn, index: read_request(conn) and None)
    with client() as http, pytest.raises(httpx2.RemoteProtocolError):
        http.get(f"{server.url}/x")
    assert server.connections == 1


def test_nothing_listening_is_a_connect_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with client() as http, pytest.raises(httpx2.ConnectError):
        http.get(f"http://127.0.0.1:{port}/")


def stalling(server_holder: list[RawServer]) -> Handler:
    def handler(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        server_holder[0].release.wait()  # no further byte until the test ends

    return handler


def test_a_body_that_stops_arriving_fails_with_a_read_timeout(serve):
    """The read timeout is the stall watchdog: no byte for that long fails the read, pulled or pumped."""
    holder: list[RawServer] = []
    holder.append(serve(stalling(holder)))
    timeout = httpx2.Timeout(5.0, read=0.3)
    with client() as http:
        with http.stream("GET", holder[0].url, timeout=timeout) as response:
            pieces = []
            with pytest.raises(httpx2.ReadTimeout):
                for piece in response.iter_raw():
                    pieces.append(piece)
        assert pieces == [b"data: one\n\n"]
        with http.stream("GET", holder[0].url, timeout=timeout) as response:
            body = pumpable(response)
            assert body is not None
            fed: list[bytes] = []
            with pytest.raises(httpx2.ReadTimeout):
                body.pump(lambda c: fed.append(c) is not None, lambda: False)
        assert fed == [b"data: one\n\n"]


def events_server(pieces: list[bytes]) -> Handler:
    def handler(conn: socket.socket, index: int) -> None:
        while read_request(conn) is not None:
            conn.sendall(CHUNKED_HEAD + b"".join(chunk(p) for p in pieces) + b"0\r\n\r\n")

    return handler


def test_a_pumped_body_is_read_on_the_provider_loop_in_order_and_its_connection_reused(serve):
    pieces = [b"data: %d\n\n" % i for i in range(20)]
    server = serve(events_server(pieces))
    seen: list[tuple[str, bytes]] = []
    ends: list[str] = []
    with client() as http:
        for _ in range(2):
            with http.stream("POST", server.url, content=b"{}") as response:
                body = pumpable(response)
                assert body is not None
                stopped = body.pump(
                    lambda c: seen.append((threading.current_thread().name, c)) is not None,
                    lambda: ends.append(threading.current_thread().name) is not None,
                )
            assert stopped is False
    assert b"".join(c for _, c in seen) == b"".join(pieces) * 2
    caller = threading.current_thread().name
    assert {name for name, _ in seen} <= {caller, "stepq-provider-io"} and set(ends) <= {caller, "stepq-provider-io"}
    assert server.connections == 1  # both bodies read to their end: the connection went back to the pool


def test_what_arrived_before_the_pump_is_read_by_the_calling_thread_the_rest_on_the_loop(serve):
    """A stream's first events come with its headers: the calling thread reads them itself, at once (its
    first delta goes out without waiting for a hand-over); what comes later is read on the loop, in order."""
    first, later = b"data: first\n\n", [b"data: %d\n\n" % i for i in range(5)]
    go_on = threading.Event()

    def staged(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(CHUNKED_HEAD + chunk(first))
        go_on.wait(30)
        conn.sendall(b"".join(chunk(piece) for piece in later) + b"0\r\n\r\n")

    server = serve(staged)
    seen: list[tuple[str, bytes]] = []

    def feed(piece: bytes) -> bool:
        seen.append((threading.current_thread().name, piece))
        return False

    ends: list[str] = []
    with client() as http, http.stream("GET", server.url) as response:
        body = pumpable(response)
        assert body is not None
        eventually(lambda: not body._queue.empty(), what="the first chunk in the body's queue")
        attach = body._attach

        def attached(*reader: Any) -> None:  # the rest is sent once the reader runs on the loop
            attach(*reader)
            go_on.set()

        body._attach = attached  # type: ignore[method-assign]
        assert body.pump(feed, lambda: ends.append(threading.current_thread().name) is not None) is False
    caller = threading.current_thread().name
    assert seen[0] == (caller, first)
    assert [piece for _, piece in seen[1:]] == later and {name for name, _ in seen[1:]} == {"stepq-provider-io"}
    assert ends == ["stepq-provider-io"]


def test_a_reader_that_stops_drops_the_connection(serve):
    """`feed` answering True (the step was cancelled) ends the read at once: the rest is never read and the
    connection is closed, not reused."""

    def endless(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(CHUNKED_HEAD + chunk(b"data: first\n\n"))
        conn.settimeout(30)
        try:
            while conn.recv(1):  # the client's close ends this (a further chunk would only be buffered)
                pass
        except OSError:
            pass
        holder[0].closed_by_peer.set()

    holder: list[RawServer] = []
    holder.append(serve(endless))
    with client() as http:
        with http.stream("GET", holder[0].url) as response:
            body = pumpable(response)
            assert body is not None
            assert body.pump(lambda c: True, lambda: False) is True
        assert holder[0].closed_by_peer.wait(30)
        assert holder[0].connections == 1


def test_a_readers_error_reaches_the_calling_thread(serve):
    server = serve(events_server([b"data: x\n\n"]))

    def bad(chunk: bytes) -> bool:
        raise ValueError("not JSON")

    with client() as http, http.stream("GET", server.url) as response:
        body = pumpable(response)
        assert body is not None
        with pytest.raises(ValueError, match="not JSON"):
            body.pump(bad, lambda: False)


def test_a_body_framed_by_the_connections_end_is_complete_when_it_closes(serve):
    def http10(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n")
        conn.sendall(b"data: b\n\n")

    server = serve(http10)
    with client() as http:
        assert http.get(server.url).text == "data: a\n\ndata: b\n\n"
        assert http.get(server.url).text == "data: a\n\ndata: b\n\n"
    assert server.connections == 2  # such a connection is never reused


def test_an_encoded_body_is_decoded_and_read_by_the_thread(serve):
    """A body with a Content-Encoding is not pumped (the reader wants plain bytes): httpx2 decodes it."""
    packed = gzip.compress(b'{"ok": true}')

    def gzipped(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(sized(packed, b"Content-Encoding: gzip\r\n"))

    server = serve(gzipped)
    with client() as http, http.stream("GET", server.url) as response:
        assert pumpable(response) is None
        assert response.read() == b'{"ok": true}'


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_https_is_verified_like_httpx2_does_it(serve, tmp_path, monkeypatch):
    """TLS through httpx2's default context: a certificate it does not trust fails the connection; trusted
    through SSL_CERT_FILE (as httpx2 reads the environment), the same server answers."""
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = serve(keep_alive, wrap=context)
    with client() as http, pytest.raises(httpx2.ConnectError):
        http.get(f"{server.url}/untrusted")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with client() as http:
        assert http.get(f"{server.url}/trusted").text.endswith("/trusted")


def _child_request(url: str, out: Any) -> None:
    with client() as http:
        out.put((http.get(f"{url}/child").text, threading.get_ident() != 0 and io_loop.running() is not None))


def test_a_forked_child_gets_a_loop_of_its_own(serve):
    """A prefork pool forks after the parent may have used its loop: the child must not wait on a loop thread
    that does not exist in it."""
    server = serve(keep_alive)
    with client() as http:
        assert http.get(f"{server.url}/parent").text.endswith("/parent")
    parent_loop = io_loop.running()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_request, args=(server.url, out))
    child.start()
    answer, had_loop = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and had_loop and answer.endswith("/child")
    assert io_loop.running() is parent_loop


GEVENT_CHILD = """
from gevent import monkey
monkey.patch_all()
import sys, threading, httpx2
from stepq.providers.loop_transport import LoopTransport
with httpx2.Client(transport=LoopTransport()) as http:
    text = http.get(sys.argv[1]).text
names = sorted(t.name for t in threading.enumerate())
import anthropic
from stepq.providers.loop_transport import loop_client
with loop_client(anthropic.DefaultHttpxClient) as sdk_http:  # the SDK's own client, with its pool limits
    transport = type(sdk_http._transport).__name__
print(text, "stepq-provider-io" in names, transport)
"""


def test_under_gevent_requests_use_httpx2s_own_transport(serve):
    """A loop thread under gevent is a greenlet that would block the hub: no loop, the blocking transport; and
    the SDK clients stepq builds are the SDK's own (LoopTransport's fallback had httpx2's 100-connection default,
    which queued a 300-stream gevent worker's requests until its steps timed out)."""
    pytest.importorskip("gevent")
    server = serve(keep_alive)
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_CHILD, f"{server.url}/g"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["conn", "0", "/g", "False", "HTTPTransport"]


def test_with_a_proxy_in_the_environment_the_sdk_keeps_its_own_client(serve, monkeypatch):
    """httpx2 reads HTTP(S)_PROXY only for a client without a transport of its own: a proxied worker's SDK
    client must be the SDK's own, so its requests reach the proxy (here a host that does not resolve)."""
    import anthropic

    from stepq.providers.loop_transport import loop_client

    def proxy(conn: socket.socket, index: int) -> None:
        request = read_request(conn)
        assert request is not None
        conn.sendall(sized(request.split(b"\r\n")[0]))

    server = serve(proxy)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    with loop_client(anthropic.DefaultHttpxClient) as http:
        assert (
            http.get("http://upstream.invalid/v1/messages").text == "GET http://upstream.invalid/v1/messages HTTP/1.1"
        )
    monkeypatch.delenv("HTTP_PROXY")
    with loop_client(anthropic.DefaultHttpxClient) as http, pytest.raises(httpx2.ConnectError):
        http.get("http://upstream.invalid/v1/messages")  # no proxy: sent directly, and the name does not resolve
