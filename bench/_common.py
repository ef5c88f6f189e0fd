"""Helpers the benchmarks share: per-run settings on the real Redis, a worker of either kind, cleanup.

Every run gets its own key prefix and queue, so it can share a Redis with tests and other runs,
and deletes only its own keys when it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from stepq.config.settings import Settings
from stepq.fleet.protocol import worker_queues

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = os.environ.get("STEPQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BENCH_AGENT_MODULES = ["bench.agents"]


def unique_prefix(kind: str) -> str:
    return f"aqb-{kind}-{uuid.uuid4().hex[:8]}"


def bench_settings(redis_url: str, prefix: str, **overrides: Any) -> Settings:
    """Settings for one run: its own prefix and queue; the rest are stepq's defaults."""
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "key_prefix": prefix,
        "queue": f"{prefix}.q",
        "agent_modules": BENCH_AGENT_MODULES,
        "approval_secret": uuid.uuid4().hex,
    }
    values.update(overrides)
    return Settings(**values)


def base_env() -> dict[str, str]:
    """This process's environment without stepq's settings, with the repository on PYTHONPATH: what a benchmark
    subprocess starts from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a `celery worker` subprocess exactly these settings."""
    return {**base_env(), **settings.to_env()}


def cleanup(redis_url: str, prefix: str) -> int:
    """Delete every key this run made (stepq keys and the broker's, both under the prefix)."""
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        for pattern in (f"{prefix}:*", f"{prefix}.*"):
            batch = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(batch), 500):
                deleted += int(client.delete(*batch[i : i + 500]))
    finally:
        client.close()
    return deleted


@contextlib.contextmanager
def logged_subprocess(
    cmd: list[str], env: dict[str, str], name: str, log_prefix: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` from the repository root with its stderr in a temp file (`log_prefix`...`.log`), stopped when
    the block ends (SIGTERM: a worker's warm shutdown). The file is deleted when the block ends cleanly and
    kept, with a line saying where (`name` stderr is in ...), when it raises."""
    with tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield proc
        except BaseException:
            print(f"{name} stderr is in {log.name}", file=sys.stderr)
            raise
        else:
            os.unlink(log.name)
        finally:
            stop_process(proc)


@contextlib.contextmanager
def running_worker(
    settings: Settings, kind: str, profile_path: str | None = None, loglevel: str = "ERROR"
) -> Iterator[Callable[[], float] | None]:
    """One Celery worker, threads pool, concurrency 1, serving the run's queues (as `stepq worker` would).

    kind="process": a `celery worker` subprocess, so the benchmark's own client work does not
    share the worker's GIL; kind="thread": in-process (celery.contrib.testing.worker).
    `profile_path`: cProfile the task bodies and write the stats there when the worker stops.
    `loglevel`: the subprocess's `--loglevel` (`stepq worker` runs at INFO; its lines go to a temp file).
    Yields a function returning the worker process's CPU seconds so far (None for a thread worker).
    """
    if kind == "thread":
        from celery.contrib.testing.worker import start_worker

        from bench import celery_app

        if profile_path:
            os.environ["STEPQ_BENCH_PROFILE"] = profile_path
        try:
            app = celery_app.build_app(settings)
        finally:
            os.environ.pop("STEPQ_BENCH_PROFILE", None)
        with start_worker(
            app,
            pool="threads",
            concurrency=1,
            perform_ping_check=False,
            loglevel="WARNING",
            queues=worker_queues(settings),
        ):
            yield None
        if profile_path:
            celery_app.dump_profile(profile_path)
        return
    env = settings_env(settings)
    if profile_path:
        env["STEPQ_BENCH_PROFILE"] = profile_path
    cmd = [
        sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
        "--pool=threads", "--concurrency=1", f"--loglevel={loglevel}", "-Q", ",".join(worker_queues(settings)),
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        f"--hostname={settings.key_prefix}@%h",
    ]  # fmt: skip
    # stopped with a warm shutdown: worker_shutdown fires, so a profile gets written
    with logged_subprocess(cmd, env, "worker", f"{settings.key_prefix}-worker-") as proc:
        yield lambda: process_cpu_seconds(proc.pid)


@contextlib.contextmanager
def running_plain_worker(redis_url: str, prefix: str, concurrency: int = 1) -> Iterator[Callable[[], float]]:
    """A `celery worker` subprocess of the plain app (bench/plain_celery.py: Celery's defaults, late acks,
    prefetch 1, nothing of stepq), threads pool, on its own queue. Yields its CPU clock."""
    from bench.plain_celery import plain_queue

    env = {**base_env(), "STEPQ_BENCH_PLAIN_REDIS_URL": redis_url, "STEPQ_BENCH_PLAIN_PREFIX": prefix}
    cmd = [
        sys.executable, "-m", "celery", "-A", "bench.plain_celery", "worker",
        "--pool=threads", f"--concurrency={concurrency}", "--loglevel=ERROR", "-Q", plain_queue(prefix),
        "--without-gossip", "--without-mingle", "--without-heartbeat", f"--hostname={prefix}-plain@%h",
    ]  # fmt: skip
    with logged_subprocess(cmd, env, "plain worker", f"{prefix}-plain-worker-") as proc:
        yield lambda: process_cpu_seconds(proc.pid)


@contextlib.contextmanager
def running_bare_worker(redis_url: str, prefix: str, prompt: str) -> Iterator[None]:
    """`python -m bench.plain_celery bare`: the plain task's body behind a bare BRPOP loop, no Celery (a
    subprocess with this environment, so the SDK's variables reach it); SIGTERM ends it."""
    cmd = [sys.executable, "-m", "bench.plain_celery", "bare", redis_url, prefix, prompt]
    with logged_subprocess(cmd, base_env(), "bare worker", f"{prefix}-bare-worker-"):
        yield


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc: less sensitive to a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live descendants (a prefork worker's children), from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += process_cpu_seconds(current)
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
    return total


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a worker's warm shutdown), then SIGKILL if it is still running after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def positive_count(raw: str) -> int:
    """argparse type of a count flag (--turns, --repeat, --levels, ...): a whole number of at least 1. A zero
    ran nothing and then divided by it."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: must be 1 or more")
    return value


def add_thread_counts(parser: argparse.ArgumentParser) -> None:
    """--concurrency: the worker thread counts a batch benchmark tries, one run each."""
    parser.add_argument(
        "--concurrency",
        type=positive_count,
        nargs="+",
        default=[1, 8],
        help="worker thread counts to try (default: 1 8)",
    )


def output_path_problem(flag: str, path: str | None) -> str | None:
    """Why an output PATH flag cannot be written (its folder is missing), as one line; None when it can. Checked
    before the run: the worker writes these files only at its shutdown, minutes later."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{flag} {path}: no folder {folder} to write to"
    return None


def profile_report(path: str, limit: int = 30) -> str:
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.sort_stats("cumulative").print_stats(limit)
    stats.sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, sep, *body])


def now() -> float:
    return time.perf_counter()
