"""The HTTP read of C concurrent paced SSE streams alone: CPU per delta by concurrency model and HTTP parser.

`bench.streaming_capacity` shows a worker spending most of a streamed delta's CPU in "model call / stream
parsing" although `bench.stream_parsing` shows the SSE decoding itself at ~6 us. This benchmark puts the
rest on record: the same C streams from the paced fake (bench/fake_upstream.py, its own process; R deltas/s
each, all open at once) read by one process in each of these ways, nothing else running in it:

    threads  + httpx   one thread per stream, `httpx2.Client.stream` + `iter_raw` (the worker's path today)
    gevent   + httpx   the same code on greenlets (Celery's gevent pool)
    asyncio  + httpx   one event loop, `httpx2.AsyncClient.stream` + `aiter_raw`
    uvloop   + httpx   the same on uvloop
    threads  + llhttp  one thread per stream, a blocking socket, httptools' C parser (llhttp, uvicorn's)
    gevent   + llhttp  the same on greenlets
    asyncio  + llhttp  one event loop, an asyncio Protocol feeding httptools
    uvloop   + llhttp  the same on uvloop
    asyncio  + aiohttp one event loop, `aiohttp.ClientSession.post` + `content.iter_any` (aiohttp's C parser)
    uvloop   + aiohttp the same on uvloop
    asyncio  + httpx/aiohttp  the anthropic SDK's own aiohttp backend (`DefaultAioHttpClient`, httpx's API
                       over aiohttp's connections) + `aiter_raw`
    uvloop   + httpx/aiohttp  the same on uvloop

Every side decodes the same SSE events (find the blank line, `json.loads` the data, keep the delta's text), so
the difference between two rows is the HTTP client stack and the concurrency model. Each side runs in a fresh
process (gevent must patch before anything imports `socket`), sides alternate for `--repeat` rounds, and the
table shows each side's median CPU per delta (the process's `process_time`, connection set-up included),
its rounds, and how long the read took against the upstream's own duration. A side that did not receive
every delta is marked failed. No target: this is the map of where a delta's read CPU goes. The aiohttp
sides need `pip install aiohttp` (not a stepq dependency); without it they are skipped, saying so.

    .venv/bin/python -m bench.stream_io --concurrency 300 --rate 50 --repeat 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from statistics import median
from typing import Any

SIDES: dict[str, tuple[str, str]] = {  # side -> (concurrency model, HTTP parser)
    "threads+httpx": ("threads", "httpx"),
    "gevent+httpx": ("gevent", "httpx"),
    "asyncio+httpx": ("asyncio", "httpx"),
    "uvloop+httpx": ("uvloop", "httpx"),
    "threads+llhttp": ("threads", "llhttp"),
    "gevent+llhttp": ("gevent", "llhttp"),
    "asyncio+llhttp": ("asyncio", "llhttp"),
    "uvloop+llhttp": ("uvloop", "llhttp"),
    "asyncio+aiohttp": ("asyncio", "aiohttp"),
    "uvloop+aiohttp": ("uvloop", "aiohttp"),
    "asyncio+httpx/aiohttp": ("asyncio", "httpx/aiohttp"),
    "uvloop+httpx/aiohttp": ("uvloop", "httpx/aiohttp"),
}
_LIBRARIES: dict[str, list[str]] = {
    "threads": [],
    "gevent": ["gevent"],
    "asyncio": ["asyncio"],
    "uvloop": ["asyncio", "uvloop"],
    "httpx": ["httpx2"],
    "llhttp": ["socket", "httptools"],
    "aiohttp": ["aiohttp"],
    "httpx/aiohttp": ["httpx2", "aiohttp", "anthropic"],
}
BODY = b'{"model":"claude-bench","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"x"}]}'
HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}


class Deltas:
    """One stream's SSE decoding: complete events out of the byte stream, the text of each delta kept."""

    __slots__ = ("buf", "texts")

    def __init__(self) -> None:
        self.buf = b""
        self.texts: list[str] = []

    def feed(self, chunk: bytes) -> None:
        buf = self.buf + chunk if self.buf else chunk
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            block = buf[start:end]
            start = end + 2
            at = block.find(b"data: ")
            if at >= 0:
                body = json.loads(block[at + 6 :])
                if body.get("type") == "content_block_delta":
                    self.texts.append(body["delta"]["text"])
        self.buf = buf[start:]


# ---------------------------------------------------------------------------- the sides (in the child process)


def _request(host: str, port: int) -> bytes:
    head = f"POST /v1/messages HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(BODY)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
    return head.encode() + b"\r\n" + BODY


class _Body:
    """httptools' callbacks for one response: body bytes to the decoder, the end noted."""

    def __init__(self) -> None:
        self.deltas = Deltas()
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.deltas.feed(body)

    def on_message_complete(self) -> None:
        self.complete = True


def _blocking(url: str, c: int, parser: str, spawn: Callable[[Callable[[], None]], Any]) -> int:
    """One thread (or greenlet) per stream, each blocked on its own read."""
    counts: list[int] = []
    if parser == "httpx":
        import httpx2

        client = httpx2.Client(limits=httpx2.Limits(max_connections=c, max_keepalive_connections=c))

        def one() -> None:
            deltas = Deltas()
            with client.stream("POST", f"{url}/v1/messages", content=BODY, headers=HEADERS) as response:
                for chunk in response.iter_raw():
                    deltas.feed(chunk)
            counts.append(len(deltas.texts))

    else:
        import socket

        import httptools

        host, port = url.rsplit("//", 1)[1].split(":")

        def one() -> None:
            body = _Body()
            http = httptools.HttpResponseParser(body)
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(_request(host, int(port)))
                while not body.complete and (data := sock.recv(1 << 16)):
                    http.feed_data(data)
            counts.append(len(body.deltas.texts))

    for join in [spawn(one) for _ in range(c)]:
        join()
    return sum(counts)


def _event_loop(url: str, c: int, parser: str, uv: bool) -> int:
    """One event loop reading every stream."""
    import asyncio

    async def streams() -> int:
        if parser in ("httpx", "httpx/aiohttp"):
            import httpx2

            limits = httpx2.Limits(max_connections=c, max_keepalive_connections=c)
            if parser == "httpx":
                client = httpx2.AsyncClient(limits=limits)
            else:  # the SDK's own aiohttp backend (`anthropic[aiohttp]`): httpx's API over aiohttp's connections
                from anthropic import DefaultAioHttpClient

                client = DefaultAioHttpClient(limits=limits)

            async def one() -> int:
                deltas = Deltas()
                async with client.stream("POST", f"{url}/v1/messages", content=BODY, headers=HEADERS) as response:
                    async for chunk in response.aiter_raw():
                        deltas.feed(chunk)
                return len(deltas.texts)

        elif parser == "aiohttp":
            import aiohttp

            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c))

            async def one() -> int:
                deltas = Deltas()
                async with session.post(f"{url}/v1/messages", data=BODY, headers=HEADERS) as response:
                    async for chunk in response.content.iter_any():
                        deltas.feed(chunk)
                return len(deltas.texts)

        else:
            import httptools

            host, port = url.rsplit("//", 1)[1].split(":")
            request = _request(host, int(port))
            loop = asyncio.get_running_loop()

            class Reader(asyncio.Protocol):
                def __init__(self, done: asyncio.Future[int]) -> None:
                    self.body, self.done = _Body(), done
                    self.http = httptools.HttpResponseParser(self.body)

                def connection_made(self, transport: asyncio.BaseTransport) -> None:
                    self.transport = transport
                    transport.write(request)  # type: ignore[attr-defined]

                def data_received(self, data: bytes) -> None:
                    self.http.feed_data(data)
                    if self.body.complete and not self.done.done():
                        self.transport.close()
                        self.done.set_result(len(self.body.deltas.texts))

                def connection_lost(self, exc: Exception | None) -> None:
                    if not self.done.done():
                        self.done.set_result(len(self.body.deltas.texts))

            async def one() -> int:
                done: asyncio.Future[int] = loop.create_future()
                await loop.create_connection(lambda: Reader(done), host, int(port))
                return await done

        return sum(await asyncio.gather(*(one() for _ in range(c))))

    if uv:
        import uvloop

        return uvloop.run(streams())
    return asyncio.run(streams())


def _thread(target: Callable[[], None]) -> Callable[[], None]:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread.join


def run_side(side: str, url: str, c: int) -> dict[str, float]:
    """Read C streams one way; the deltas received and this process's CPU and wall time doing it."""
    model, parser = SIDES[side]
    for module in _LIBRARIES[model] + _LIBRARIES[parser]:  # imported before the clocks start: not per-delta cost
        importlib.import_module(module)
    cpu0, wall0 = time.process_time(), time.monotonic()
    if model == "threads":
        got = _blocking(url, c, parser, _thread)
    elif model == "gevent":
        import gevent

        got = _blocking(url, c, parser, lambda target: gevent.spawn(target).join)
    else:
        got = _event_loop(url, c, parser, uv=model == "uvloop")
    return {"deltas": got, "cpu": time.process_time() - cpu0, "wall": time.monotonic() - wall0}


# ---------------------------------------------------------------------------- the driver


def measure(side: str, url: str, c: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "bench.stream_io", "--side", side, "--url", url, "--concurrency", str(c)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"side {side} failed: {out.stderr.strip().splitlines()[-1:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=300, help="streams at once (default 300)")
    parser.add_argument("--rate", type=int, default=50, help="deltas/s per stream (default 50)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long each stream lasts (default 2)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds, sides alternating (default 2)")
    parser.add_argument("--sides", nargs="*", choices=list(SIDES), default=list(SIDES))
    parser.add_argument("--side", help=argparse.SUPPRESS)  # the child process: run one side, print JSON
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        if SIDES[args.side][0] == "gevent":
            from gevent import monkey

            monkey.patch_all()
        print(json.dumps(run_side(args.side, args.url, args.concurrency)))
        return
    if args.concurrency < 1 or args.rate < 1 or args.seconds <= 0 or args.repeat < 1:
        parser.error("--concurrency, --rate and --repeat must be at least 1 and --seconds above 0")

    from bench._common import table
    from bench.fake_upstream import Script, running_upstream

    deltas = round(args.rate * args.seconds)
    script = Script(first_ms=0, deltas=deltas, interval_ms=1000 / args.rate, gate=args.concurrency)
    expected = deltas * args.concurrency
    print(
        f"{args.concurrency} streams of {deltas} deltas at {args.rate}/s ({args.seconds:g} s each), "
        f"sides alternating, {args.repeat} rounds; one fresh process per side and round",
        flush=True,
    )
    sides = [side for side in args.sides if "aiohttp" not in side or importlib.util.find_spec("aiohttp")]
    if len(sides) < len(args.sides):
        print("aiohttp is not installed: its sides are skipped (pip install aiohttp)", flush=True)
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with running_upstream(script) as upstream:
        for round_no in range(args.repeat):
            for side in sides:
                upstream.configure(script)
                try:
                    result = measure(side, upstream.base_url, args.concurrency)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    sys.exit(f"bench.stream_io: {exc}")  # one line, not a traceback
                results[side].append(result)
                us = 1e6 * result["cpu"] / max(result["deltas"], 1)
                print(f"round {round_no + 1} {side}: {us:.1f} us/delta, {result['wall']:.2f} s", flush=True)
    rows = []
    for side, runs in results.items():
        per_delta = [1e6 * r["cpu"] / max(r["deltas"], 1) for r in runs]
        complete = all(r["deltas"] == expected for r in runs)
        model, http = SIDES[side]
        rows.append(
            [
                model,
                http,
                f"{median(per_delta):.1f}",
                " / ".join(f"{v:.1f}" for v in per_delta),
                f"{median(100 * r['cpu'] / r['wall'] for r in runs):.0f}",
                f"{median(r['wall'] for r in runs) / args.seconds:.2f}x",
                "ok" if complete else f"FAILED ({min(int(r['deltas']) for r in runs)}/{expected} deltas)",
            ]
        )
    headers = ["model", "http", "cpu us/delta", "rounds", "% of a core", "read/upstream", "deltas"]
    print()
    print(table(headers, rows))
    print(
        "\ncpu us/delta: the reading process's CPU (connection set-up included) per delta received, median of the "
        "rounds.\nread/upstream: the read's wall time against the upstream's duration (above ~1.1x the reader "
        "fell behind)."
    )


if __name__ == "__main__":
    main()
