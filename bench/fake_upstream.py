"""The provider benchmarks' shared pieces: a paced fake Anthropic Messages API, the agent that
streams from it, and the `celery worker` subprocess both benchmarks run.

Unlike tests/fakes/anthropic_server.py (a thread per request, replies sent as fast as possible),
this server paces its stream: `first_ms` before the first event, then one `text_delta` every
`interval_ms`. It runs in its own process on one asyncio loop, so hundreds of concurrent streams
cost it little and never share a GIL with the worker or the benchmark. One timer (a heap of
due times) writes every frame that is due; the lateness of each write against its schedule
is recorded, so a run can show that the upstream kept its pace (`/_bench/stats`).

Responses are HTTP/1.1, chunked, keep-alive, like the real API, so the SDK reuses connections.
Each delta's text is the wall-clock time it was written (`"1712345678.123456|"`): a subscriber
that splits the text it receives measures upstream-write -> subscriber latency per delta.

    python -m bench.fake_upstream          # prints "PORT <n>", then serves until stdin closes
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from stepq.agents.definition import AgentDefinition
from stepq.config.settings import Settings
from stepq.fleet.protocol import worker_queues

STAMP_SEP = "|"

# The agent the provider benchmarks submit: one step, no tools, on the `anthropic` provider
# (the SDK reaches this server through ANTHROPIC_BASE_URL). The default coalescing window applies.
streamer = AgentDefinition(
    id="bench.streamer",
    system_prompt="benchmark",
    default_provider="anthropic",
    default_model="claude-bench",
    max_output_tokens=1024,
)


@dataclass
class Script:
    """How every stream is paced. `gate`: hold streams until that many are open, then start them
    together, each at a random phase within one interval (so C streams really overlap)."""

    first_ms: float = 50.0
    deltas: int = 200
    interval_ms: float = 10.0
    gate: int = 0
    gate_timeout_s: float = 60.0


def _frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\nrequest-id: req_bench\r\n\r\n"
)
_START = _frame(
    {
        "type": "message_start",
        "message": {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": "claude-bench",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }
) + _frame({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
_DELTA_HEAD = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
)
_DELTA_TAIL = b'"}}\n\n'


def _end(output_tokens: int) -> bytes:
    return (
        _frame({"type": "content_block_stop", "index": 0})
        + _frame(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            }
        )
        + _frame({"type": "message_stop"})
    )


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Stream:
    __slots__ = ("done", "head_sent", "sent", "start", "transport")

    def __init__(self, transport: asyncio.BaseTransport, done: asyncio.Future[None]) -> None:
        self.transport: Any = transport
        self.sent = 0  # deltas written
        self.start = 0.0  # loop time of the first event
        self.done = done
        self.head_sent = False


class PacedServer:
    """The asyncio server: one heap of due frames, written by one timer task."""

    def __init__(self) -> None:
        self.script = Script()
        self._heap: list[tuple[float, int, _Stream]] = []
        self._counter = itertools.count()
        self._waiter: asyncio.Future[None] | None = None
        self._gated: list[_Stream] = []
        self._gate_started = 0.0
        self.open = 0
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.lags: list[float] = []  # seconds each frame was written after its due time
        self.streams = 0
        self.max_open = self.open
        self.gate_waits: list[float] = []  # seconds from a gate's first request to its release
        self.cpu0 = time.process_time()
        self.wall0 = time.monotonic()

    def stats(self) -> dict[str, Any]:
        lags = sorted(self.lags)

        def pct(q: float) -> float:
            return lags[min(len(lags) - 1, round(q / 100 * (len(lags) - 1)))] * 1000 if lags else 0.0

        wall = time.monotonic() - self.wall0
        result = {
            "streams": self.streams,
            "frames": len(lags),
            "max_open": self.max_open,
            "lag_p50_ms": pct(50),
            "lag_p99_ms": pct(99),
            "lag_max_ms": lags[-1] * 1000 if lags else 0.0,
            "gate_wait_s": max(self.gate_waits, default=0.0),
            "cpu_pct": 100 * (time.process_time() - self.cpu0) / wall if wall > 0 else 0.0,
        }
        self._reset_stats()
        return result

    # ------------------------------------------------------------------ scheduling

    def _schedule(self, when: float, stream: _Stream) -> None:
        heapq.heappush(self._heap, (when, next(self._counter), stream))
        if self._waiter is not None:
            _wake(self._waiter)

    def _begin(self, stream: _Stream, t0: float) -> None:
        stream.start = t0 + self.script.first_ms / 1000
        self._schedule(stream.start, stream)

    def _add(self, stream: _Stream) -> None:
        loop = asyncio.get_running_loop()
        self.streams += 1
        gate = self.script.gate
        if gate <= 0:
            self._begin(stream, loop.time())
            return
        if not self._gated:
            self._gate_started = loop.time()
        self._gated.append(stream)
        if len(self._gated) >= gate:
            self._release()

    def _release(self) -> None:
        now = asyncio.get_running_loop().time()
        self.gate_waits.append(now - self._gate_started)
        interval = self.script.interval_ms / 1000
        for stream in self._gated:
            self._begin(stream, now + random.uniform(0, interval))
        self._gated.clear()

    async def ticker(self) -> None:
        """Write every frame that is due; sleep until the next one (or until a stream is added)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._gated and loop.time() - self._gate_started > self.script.gate_timeout_s:
                self._release()  # fewer requests came than the gate expected: start what we have
            now = loop.time()
            while self._heap and self._heap[0][0] <= now:
                due, _, stream = heapq.heappop(self._heap)
                self.lags.append(now - due)
                self._send_due(stream, now)
            await self._sleep_until(self._heap[0][0] if self._heap else now + 1.0)

    async def _sleep_until(self, when: float) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_at(when, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _send_due(self, stream: _Stream, now: float) -> None:
        s = self.script
        interval = s.interval_ms / 1000
        if stream.transport.is_closing():  # the client went away mid-stream
            if not stream.done.done():
                stream.done.set_result(None)
            return
        out = bytearray()
        if not stream.head_sent:
            stream.head_sent = True
            stream.transport.write(_HEAD)
            out += _START
        if stream.sent < s.deltas:
            stamp = f"{time.time():.6f}{STAMP_SEP}".encode()
            out += _DELTA_HEAD + stamp + _DELTA_TAIL
            stream.sent += 1
            stream.transport.write(_chunk(bytes(out)))
            self._schedule(stream.start + stream.sent * interval, stream)
            return
        stream.transport.write(_chunk(bytes(out) + _end(s.deltas)) + b"0\r\n\r\n")
        if not stream.done.done():
            stream.done.set_result(None)

    # ------------------------------------------------------------------ HTTP

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                route = path.split("?")[0]
                if method == "POST" and route == "/v1/messages":
                    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    stream = _Stream(writer.transport, done)
                    self.open += 1
                    self.max_open = max(self.max_open, self.open)
                    try:
                        self._add(stream)
                        await done
                    finally:
                        self.open -= 1
                    if writer.transport.is_closing():
                        return
                elif route == "/_bench/state":
                    self._json(writer, {"open": self.open, "gated": len(self._gated)})
                elif route == "/_bench/stats":
                    self._json(writer, self.stats())
                elif route == "/_bench/config" and method == "POST":
                    self.script = Script(**json.loads(body))
                    self._json(writer, asdict(self.script))
                else:
                    self._json(writer, {"type": "error", "error": {"type": "not_found_error", "message": path}}, 404)
        finally:
            writer.close()

    @staticmethod
    def _json(writer: asyncio.StreamWriter, body: dict[str, Any], status: int = 200) -> None:
        payload = json.dumps(body).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(payload), payload)
        )


async def _serve() -> None:
    server = PacedServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    ticker = asyncio.create_task(server.ticker())
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # serve until the parent closes our stdin
    ticker.cancel()
    listener.close()
    os._exit(0)  # open keep-alive connections need no goodbye


def renice(nice: int) -> bool:
    """Set this process's scheduling priority (negative needs root); False when not permitted."""
    if nice == 0:
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        return False
    return True


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    renice(int(os.environ.get("STEPQ_BENCH_UPSTREAM_NICE", "0")))
    asyncio.run(_serve())


# --------------------------------------------------------------------------- the parent's handle


class Upstream:
    """The server as a subprocess: `configure` its script, read its `stats` (which resets them).
    `nice`: its scheduling priority; below 0 it is served before other programs on a busy machine,
    as if it ran on a machine of its own (needs root; ignored otherwise)."""

    def __init__(self, nice: int = 0) -> None:
        from bench._common import ROOT

        env = {**os.environ, "PYTHONPATH": str(ROOT), "STEPQ_BENCH_UPSTREAM_NICE": str(nice)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fake_upstream"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"fake upstream did not start: {line!r}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"
        self._lock = threading.Lock()

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        with self._lock, urllib.request.urlopen(f"{self.base_url}{path}", data=data, timeout=30) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    def configure(self, script: Script) -> None:
        self._call("/_bench/config", asdict(script))

    def stats(self) -> dict[str, Any]:
        return self._call("/_bench/stats")

    def wait_streaming(self, count: int, timeout: float) -> bool:
        """Until `count` streams are open and none is held at the gate (polls; for the profiler's start)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self._call("/_bench/state")
            if state["open"] >= count and not state["gated"]:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def running_upstream(script: Script, nice: int = 0) -> Iterator[Upstream]:
    upstream = Upstream(nice)
    try:
        upstream.configure(script)
        yield upstream
    finally:
        upstream.close()


API_KEY = "sk-ant-bench-not-a-real-key"


def sdk_env(base_url: str) -> dict[str, str]:
    """The SDK's standard variables pointing at the fake (set for the worker and for this process)."""
    return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": API_KEY}


@contextlib.contextmanager
def stepq_worker(
    settings: Settings,
    concurrency: int,
    base_url: str,
    pool: str = "threads",
    app: str = "stepq.workers.celery_app",
    extra_env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`celery -A stepq.workers.celery_app worker --pool=POOL --concurrency=C` (what `stepq worker --pool POOL`
    runs, without beat), with the SDK pointed at the fake upstream. `app="bench.celery_app"`: the same app
    plus the benchmark's stage clocks (bench/stages.py)."""
    from bench._common import logged_subprocess, settings_env

    env = {k: v for k, v in settings_env(settings).items() if not k.startswith("ANTHROPIC_")}
    env.update(sdk_env(base_url))
    env.update(extra_env or {})
    cmd = [
        sys.executable, "-m", "celery", "-A", app, "worker",
        f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=ERROR",
        "-Q", ",".join(worker_queues(settings)), "--without-gossip", "--without-mingle", "--without-heartbeat",
        f"--hostname={settings.key_prefix}-{pool}-c{concurrency}@%h",
    ]  # fmt: skip
    with logged_subprocess(cmd, env, "worker", f"{settings.key_prefix}-worker-") as proc:
        yield proc


def stamps(text: str) -> list[float]:
    """The write times carried by a delta text (coalesced deltas carry several)."""
    return [float(s) for s in text.split(STAMP_SEP) if s]


if __name__ == "__main__":
    main()
