"""Many concurrent SSE streams on ONE gateway process: the shared pub/sub hub vs one connection per stream.

For each design, in the same run: a `stepq serve` app (real uvicorn, its own process) serves N SSE
clients (asyncio + httpx, in separate client processes), each following its own running turn. The
turns' events are synthetic: this process writes them with the real event-log writer (`EventLog`,
the same Lua script a worker's emitter uses) at a paced rate per turn, because N real model turns
would measure the workers, not the gateway. Each text-delta event carries the `ts` the writer
stamps; a client records receive time minus `ts` (publish -> client). Reported per design:
publish->client p50/p99, events delivered, gateway CPU (per cent of one core while publishing),
and the Redis connections the gateway holds (CLIENT LIST, filtered by its client name) — once
with few streams open and once with all N. Every client also checks its stream: seqs 1..last,
each once, in order, ending with `turn-finish`.

Target: >= 2,000 concurrent streams on one gateway with p99 <= 250 ms, and the gateway's Redis
connections independent of N (the naive design holds one per stream).

    .venv/bin/python -m bench.gateway_streams --streams 2000 --rate 5 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import redis.asyncio as aioredis

from bench._common import (
    DEFAULT_REDIS_URL,
    bench_settings,
    cleanup,
    percentile,
    positive_count,
    process_cpu_seconds,
    settings_env,
    stop_process,
    table,
    unique_prefix,
)
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType
from stepq.producer.gateway.streams import Listener, RawEvent, StreamHub
from stepq.turns.submit import create_turn

AGENT = "bench.overhead"
TARGET_STREAMS = 2000
TARGET_P99_MS = 250.0
POOL = 16  # the gateway's async command pool (STEPQ_GATEWAY_REDIS_POOL); plus ONE pub/sub connection
GROUPS = 10  # turns publish in staggered groups across each tick, not all in one burst


class NaiveHub(StreamHub):
    """The design the hub replaces: every stream opens its own pub/sub connection and reader task."""

    def __init__(self, pubsub_client: aioredis.Redis) -> None:
        super().__init__(pubsub_client)
        kwargs = dict(pubsub_client.connection_pool.connection_kwargs)
        self._own = aioredis.Redis(connection_pool=aioredis.ConnectionPool(max_connections=100_000, **kwargs))
        self._count = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self._own.aclose()

    @property
    def subscribed_channels(self) -> int:
        return self._count

    @contextlib.asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[Listener]:
        listener = Listener()
        pubsub = self._own.pubsub()
        await pubsub.subscribe(channel)
        while True:  # wait for the confirmation, as the shared hub does
            message = await pubsub.get_message(timeout=30)
            if message is not None and message["type"] == "subscribe":
                break

        async def pump() -> None:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None and message["type"] == "message":
                    listener.push(RawEvent.parse(message["data"]))

        task = asyncio.create_task(pump())
        self._count += 1
        try:
            yield listener
        finally:
            self._count -= 1
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            with contextlib.suppress(Exception):
                await pubsub.aclose()


# --------------------------------------------------------------------------- the gateway process


def run_gateway(mode: str, port: int) -> None:
    """Entry point of the gateway subprocess (settings come from the STEPQ_* environment). `shared-<N>proc`
    runs uvicorn with N worker processes on the one port, each with its own hub (and its own connections)."""
    import uvicorn

    raise_fd_limit()
    options: dict[str, Any] = {"host": "127.0.0.1", "port": port, "log_level": "warning", "backlog": 8192}
    options["timeout_keep_alive"] = 600
    workers = gateway_procs(mode)
    if workers > 1:
        os.environ["STEPQ_BENCH_GATEWAY_MODE"] = mode
        uvicorn.run("bench.gateway_streams:app_from_env", factory=True, workers=workers, **options)
    else:
        uvicorn.run(build_app(mode), **options)


def gateway_procs(mode: str) -> int:
    """How many gateway processes a design runs: `shared-2proc` is 2, the others 1."""
    return int(mode.removeprefix("shared-").removesuffix("proc")) if mode.endswith("proc") else 1


def build_app(mode: str) -> Any:
    from stepq.config.settings import Settings
    from stepq.producer.gateway.app import create_app
    from stepq.producer.gateway.auth import AuthConfig

    return create_app(Settings(), AuthConfig(insecure_dev=True), hub_factory=NaiveHub if mode == "naive" else None)


def app_from_env() -> Any:
    """The app factory each uvicorn worker process calls (`shared-<N>proc`)."""
    raise_fd_limit()
    return build_app(os.environ["STEPQ_BENCH_GATEWAY_MODE"])


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process and its direct children (uvicorn's worker processes), from /proc."""
    total = process_cpu_seconds(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != str(pid):
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    total += process_cpu_seconds(int(entry))
    return total


def raise_fd_limit() -> None:
    """Thousands of sockets per process: the soft open-files limit up to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- the client processes


class SSEClient(asyncio.Protocol):
    """One SSE client on a raw socket: HTTP/1.1 chunked decoding and SSE framing by hand, checks the seqs and
    records publish->client latency of text deltas. (Not httpx: at 10,000 events/s its per-event cost made
    the client processes, not the gateway, what the benchmark measured.)"""

    def __init__(self, request: bytes, out: dict[str, Any], ready: asyncio.Event, done: asyncio.Future[None]):
        self.request, self.out, self.ready, self.done = request, out, ready, done
        self.raw = b""
        self.body = b""
        self.headers_seen = False
        self.expected = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        received = time.time()
        raw = self.raw + data
        if not self.headers_seen:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                self.raw = raw
                return
            status = raw[: raw.find(b"\r\n")]
            if b" 200 " not in status:
                self._end(f"HTTP {status.decode(errors='replace')}")
                return
            self.headers_seen = True
            raw = raw[end + 4 :]
        pos, body = 0, self.body
        while True:  # chunked transfer encoding: <hex size>\r\n<size bytes>\r\n
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(raw[pos:eol], 16)
            if len(raw) < eol + 4 + size:
                break
            body += raw[eol + 2 : eol + 2 + size]
            pos = eol + 4 + size
            if size == 0:
                self._end("stream ended before turn-finish")
                return
        self.raw = raw[pos:]
        *frames, self.body = body.split(b"\n\n")
        for frame in frames:
            if frame.startswith(b":"):
                continue  # a comment (the opening line, keep-alives)
            head, _, data = frame.partition(b"\ndata: ")
            id_line, _, event_line = head.partition(b"\n")
            seq, kind = int(id_line[4:]), event_line[7:]
            if seq != self.expected:
                self.out["errors"].append(f"seq {seq}, expected {self.expected}")
            self.expected = seq + 1
            if kind == b"text-delta":
                ts = float(data[data.rindex(b'"ts":') + 5 : -1])
                self.out["latencies"].append(received - ts)
            elif kind == b"turn-start":
                self.ready.set()
            elif kind == b"turn-finish":
                self.out["finished"] += 1
                self._end(None)
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._end("connection closed before turn-finish")

    def _end(self, error: str | None) -> None:
        if self.done.done():
            return
        if error is not None:
            self.out["errors"].append(error)
        self.ready.set()
        self.done.set_result(None)


async def _follow(host: str, port: int, turn_id: str, ready: asyncio.Event, out: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    request = f"GET /v1/turns/{turn_id}/events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
    transport, _ = await loop.create_connection(lambda: SSEClient(request.encode(), out, ready, done), host, port)
    try:
        await done
    finally:
        transport.close()


def run_clients(url: str, turn_ids: list[str], ready_q: Any, result_q: Any) -> None:
    """Entry point of one client process: follow its share of the turns, report when all end (and its CPU
    seconds from the moment every stream was open, i.e. while events were delivered)."""
    raise_fd_limit()
    host, port = url.rsplit("//", 1)[1].split(":")

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {"latencies": [], "errors": [], "finished": 0}
        readies = [asyncio.Event() for _ in turn_ids]
        tasks = []
        for turn_id, ready in zip(turn_ids, readies, strict=True):
            tasks.append(asyncio.create_task(_follow(host, int(port), turn_id, ready, out)))
            await asyncio.sleep(0)  # let connects interleave (no thundering herd of SYNs)
        await asyncio.gather(*(r.wait() for r in readies))
        out["cpu_at_ready"] = own_cpu_seconds()
        ready_q.put(len(turn_ids))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        out["errors"] += [repr(r) for r in results if isinstance(r, BaseException)]
        return out

    try:
        import uvloop

        out = uvloop.run(main())
    except ImportError:
        out = asyncio.run(main())
    out["cpu_delivering"] = own_cpu_seconds() - out["cpu_at_ready"]
    result_q.put(out)


# --------------------------------------------------------------------------- one design, measured


def gateway_connections(rt: Any, name: str) -> int:
    return sum(1 for c in rt.redis.client_list() if c.get("name") == name)


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from stepq.producer.gateway.service import client_name

    prefix = unique_prefix(f"gw-{mode}")
    settings = bench_settings(
        args.redis_url, prefix, gateway_rate_limit_rpm=0, gateway_redis_pool=POOL, event_ttl_s=600
    )
    rt = get_runtime(settings)
    name = client_name(settings)
    turn_ids = [create_turn(rt, AGENT, prompt="go", metadata={"tenant": "dev"})[0].turn_id for _ in range(args.streams)]
    port = free_port()
    env = settings_env(settings)
    log_path = os.path.join(tempfile.gettempdir(), f"{prefix}.log")
    log_file = open(log_path, "w")  # noqa: SIM115 - closed in the finally below
    gateway = subprocess.Popen(
        [sys.executable, "-m", "bench.gateway_streams", "--serve", mode, "--port", str(port)],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    ctx = mp.get_context("spawn")
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    clients: list[Any] = []
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_listening(port, gateway)
        idle = gateway_connections(rt, name)
        shares = [turn_ids[i :: args.client_procs] for i in range(args.client_procs)]
        # a few streams first: the connection count with almost nothing open
        clients.append(ctx.Process(target=run_clients, args=(url, shares[0][:10], ready_q, result_q)))
        clients[-1].start()
        ready_q.get(timeout=300)
        few = gateway_connections(rt, name)
        rest = [shares[0][10:], *shares[1:]]
        for share in rest:
            if share:
                clients.append(ctx.Process(target=run_clients, args=(url, share, ready_q, result_q)))
                clients[-1].start()
        for share in rest:
            if share:
                ready_q.get(timeout=600)
        held = gateway_connections(rt, name)
        profilers = start_profilers(args, mode, {"gateway": gateway.pid, "client": clients[-1].pid})
        gw0, self0, redis0, t0 = (
            tree_cpu_seconds(gateway.pid),
            own_cpu_seconds(),
            redis_cpu_seconds(rt),
            time.monotonic(),
        )
        published = publish(rt, turn_ids, args.rate, args.seconds)
        elapsed = time.monotonic() - t0
        cpu = (tree_cpu_seconds(gateway.pid) - gw0) / elapsed
        held = max(held, gateway_connections(rt, name))
        finals = [rt.events.submit(t, EventType.TURN_FINISH, 1, {"finish_reason": "stop"}) for t in turn_ids]
        for pending in finals:
            rt.events.wait(pending)
        results = [result_q.get(timeout=600) for _ in clients]
        # CPU seconds spent on the events, publish start -> the last client's turn-finish (a gateway that fell
        # behind keeps working after the publisher stops: counted)
        spent = {
            "gateway": tree_cpu_seconds(gateway.pid) - gw0,
            "clients": sum(r["cpu_delivering"] for r in results),
            "publisher": own_cpu_seconds() - self0,
            "redis": redis_cpu_seconds(rt) - redis0,
        }
        for proc in profilers:
            proc.wait(timeout=120)
    finally:
        for proc in clients:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
        stop_process(gateway)
        log_file.close()
        cleanup(args.redis_url, prefix)
    latencies = [x for r in results for x in r["latencies"]]
    errors = [e for r in results for e in r["errors"]]
    return {
        "mode": mode,
        "streams": args.streams,
        "finished": sum(r["finished"] for r in results),
        "published": published,
        "delivered": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000 if latencies else float("nan"),
        "cpu": cpu * 100,
        "spent_us": {k: v / max(published, 1) * 1e6 for k, v in spent.items()},
        "events_per_s": published / elapsed,
        "conn_idle": idle,
        "conn_few": few,
        "conn_all": held,
        "errors": errors,
        "log": log_path,
    }


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_cpu_seconds(rt: Any) -> float:
    """Redis's own CPU (INFO cpu): the whole server, so other users of it on a shared machine count too."""
    info = rt.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def start_profilers(args: argparse.Namespace, mode: str, pids: dict[str, int | None]) -> list[subprocess.Popen[Any]]:
    """`--profile DIR`: py-spy samples the gateway and one client process while the events are published
    (raw collapsed stacks, one file each; `py-spy` must be installed: pip install py-spy)."""
    if not args.profile:
        return []
    os.makedirs(args.profile, exist_ok=True)
    procs = []
    for role, pid in pids.items():
        out = os.path.join(args.profile, f"{mode}-{role}.txt")
        spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or "py-spy"
        cmd = [spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds)), "--rate", "50"]
        cmd += ["--nonblocking", "--subprocesses", "--format", "raw", "--output", out]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def _wait_listening(port: int, proc: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise SystemExit("the gateway did not start listening")


def publish(rt: Any, turn_ids: list[str], rate: float, seconds: float) -> int:
    """Every turn gets `rate` text deltas a second for `seconds`, its group offset within each tick.

    Each group's events go out the way a worker's do: queued on the event log's group commit and
    written in one pipelined round trip."""
    groups = [turn_ids[i::GROUPS] for i in range(GROUPS)]
    interval = 1.0 / rate / GROUPS
    ticks = int(rate * seconds * GROUPS)
    start = time.monotonic()
    count = 0
    for tick in range(ticks):
        delay = start + tick * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        pending = [rt.events.submit(t, EventType.TEXT_DELTA, 1, {"text": "abcd"}) for t in groups[tick % GROUPS]]
        for p in pending:
            rt.events.wait(p)
        count += len(pending)
    return count


def cpu_table(results: list[dict[str, Any]]) -> str:
    """Where the CPU went: microseconds of CPU per published event, per component, from the first publish to
    the last client's turn-finish (what a busy machine changes least), and the cores that adds up to at the
    configured rate (2 cores: everything here shares them)."""
    rows = []
    for r in results:
        spent = r["spent_us"]
        total = sum(spent.values())
        rows.append(
            [r["mode"], f"{r['events_per_s']:.0f}"]
            + [f"{spent[k]:.0f}" for k in ("gateway", "clients", "publisher", "redis")]
            + [f"{total:.0f}", f"{total * r['events_per_s'] / 1e6:.2f}"]
        )
    headers = ["design", "events/s", "gateway us", "clients us", "publisher us", "redis us", "sum us", "cores"]
    return table(headers, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--streams", type=positive_count, default=TARGET_STREAMS, help="concurrent SSE clients per design"
    )
    parser.add_argument("--rate", type=float, default=5.0, help="text-delta events per second per turn")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long every turn streams")
    parser.add_argument("--client-procs", type=positive_count, default=2, help="processes the clients are spread over")
    parser.add_argument(
        "--modes", default="shared,naive", help="designs to run, in order: shared, naive, shared-<K>proc (K processes)"
    )
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the gateway and a client while publishing")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run_gateway(args.serve, args.port)
        return 0
    raise_fd_limit()
    print(
        f"{args.streams} SSE streams on one gateway process, {args.rate:g} text-delta events/s per turn for "
        f"{args.seconds:g} s; events are synthetic (written with the event-log writer, no model, no worker); "
        f"clients in {args.client_procs} processes; machine: {os.cpu_count()} cores",
        flush=True,
    )
    rows = []
    results = []
    for mode in args.modes.split(","):
        result = measure(mode, args)
        results.append(result)
        rows.append(
            [
                result["mode"],
                str(result["streams"]),
                f"{result['finished']}/{result['streams']}",
                f"{result['delivered']}/{result['published']}",
                f"{result['p50_ms']:.1f}",
                f"{result['p99_ms']:.1f}",
                f"{result['max_ms']:.0f}",
                f"{result['cpu']:.0f}%",
                f"{result['conn_idle']}/{result['conn_few']}/{result['conn_all']}",
                str(len(result["errors"])),
            ]
        )
        print(f"  {mode}: done (gateway log: {result['log']})", flush=True)
        for error in result["errors"][:5]:
            print(f"    error: {error}")
    headers = [
        "design",
        "streams",
        "ended",
        "delivered",
        "p50 ms",
        "p99 ms",
        "max ms",
        "gw CPU",
        "redis conns",
    ]
    print(table([*headers, "errors"], rows))
    print()
    print(cpu_table(results))
    print(f"machine load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("gw CPU: the gateway process while publishing (100% = one core)")
    print("us: CPU microseconds per event, publish start to the last turn-finish; redis is the whole server's")
    print(
        "redis conns: the gateway's connections (CLIENT LIST by its client name) idle / 10 streams / all streams; "
        f"the shared design is bounded by its pool ({POOL}) + 1 pub/sub connection, whatever N "
        "(shared-<K>proc: K gateway processes, K times that)"
    )
    shared = next((r for r in results if r["mode"] == "shared"), None)
    ok = False
    if shared is not None:
        ok = (
            shared["streams"] >= TARGET_STREAMS
            and shared["p99_ms"] <= TARGET_P99_MS
            and shared["conn_all"] <= POOL + 1
            and not shared["errors"]
        )
        print(
            f"target (>= {TARGET_STREAMS} streams, p99 <= {TARGET_P99_MS:.0f} ms, <= {POOL + 1} connections at any N): "
            f"{'met' if ok else 'NOT met'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
