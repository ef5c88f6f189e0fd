"""Shared fixtures: a unique key prefix per test on the real local Redis, a runtime, in-process and
subprocess Celery workers. Each test cleans up only the keys under its own prefix."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from stepq.config.settings import Settings
from stepq.fleet.protocol import worker_queues
from stepq.fleet.runtime import Runtime, get_runtime

REDIS_URL = os.environ.get("STEPQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("STEPQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
ROOT = Path(__file__).resolve().parent.parent
# every tests/agents*.py module defines agents and tools for the tests; workers load them all
TEST_AGENT_MODULES = [
    *sorted(f"tests.{p.stem}" for p in Path(__file__).parent.glob("agents*.py")),
    "stepq.agents.demo",
]


WORKER_LOGS = Path(tempfile.gettempdir()) / "stepq-test-worker-logs"
WORKER_LOGS.mkdir(exist_ok=True)
WORKER_LOG_TAIL = 20_000
_RESERVED_PORTS: list[socket.socket] = []


@atexit.register
def _release_reserved_ports() -> None:
    for sock in _RESERVED_PORTS:
        sock.close()


def free_port() -> int:
    """A loopback port free now, released for a server the test starts to bind."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def closed_port() -> int:
    """A loopback port that refuses connections for the whole session.

    The socket stays bound but never listens: connecting gets a refusal, and no other server (a test's uvicorn
    or fake provider binding port 0) can be handed the same number meanwhile, which a bind-then-close port
    allowed (a CI run once met an HTTP server there: "Protocol error, got '<'")."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _RESERVED_PORTS.append(sock)
    return int(sock.getsockname()[1])


def make_settings(prefix: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": REDIS_URL,
        "key_prefix": prefix,
        "queue": f"{prefix}.steps",
        "agent_modules": TEST_AGENT_MODULES,
        "approval_secret": f"test-approval-secret-{prefix}".ljust(32, "0"),  # 32+ bytes, as Settings requires
        # long enough that a heartbeat starved on a loaded machine does not lose it (a lost lease re-runs
        # the step, and a scripted fake has no reply for the re-run); short enough that kill tests recover fast
        "lease_ttl_s": 10.0,
        "sweep_interval_s": 0.5,
        "retry_base_s": 0.05,
        "retry_cap_s": 0.2,
        "coalesce_window_ms": 5.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def amqp_available() -> bool:
    """Whether RabbitMQ answers at AMQP_URL (the tests that need it skip otherwise)."""
    from kombu import Connection

    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a subprocess the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env.update(settings.to_env())
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"aqt-{uuid.uuid4().hex[:10]}"
    yield value
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{value}:*", count=1000):
        client.delete(key)
    for key in client.scan_iter(match=f"{value}.*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix)


@pytest.fixture
def rt(settings: Settings) -> Runtime:
    return get_runtime(settings)


@pytest.fixture
def worker(settings: Settings) -> Iterator[object]:
    """An in-process Celery worker (threads pool) serving this test's queue on real Redis."""
    from stepq.workers.app import create_app

    app = create_app(settings)
    with start_worker(
        app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING", queues=worker_queues(settings)
    ) as w:
        yield w


@pytest.fixture
def client(settings: Settings, rt: Runtime) -> object:
    from stepq.producer.client import Client

    return Client(settings)


class WorkerProcess:
    """`celery worker` in a subprocess, so a test can SIGKILL it. Any still running at exit are killed.

    Each runs in its own process group, and kill/stop signal the whole group: `-B` forks the beat
    scheduler as a child that would otherwise outlive a SIGKILLed worker."""

    running: ClassVar[set[WorkerProcess]] = set()
    logs: ClassVar[dict[str, Path]] = {}  # name -> log file, of the workers the current test started

    def __init__(
        self,
        settings: Settings,
        name: str,
        beat: bool = True,
        concurrency: int = 2,
        pool: str = "threads",
        log_path: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        cmd = [
            sys.executable, "-m", "celery", "-A", "stepq.workers.celery_app", "worker",
            f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=WARNING",
            f"--hostname={name}@%h", "-Q", ",".join(worker_queues(settings)), "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        if beat:
            cmd += ["-B", "--schedule", f"/tmp/{settings.key_prefix}-{name}-beat"]
        if log_path is None:  # kept so a failed test's report can show it (see pytest_runtest_makereport)
            log_path = str(WORKER_LOGS / f"{settings.key_prefix}-{name}.log")
            WorkerProcess.logs[name] = Path(log_path)
        with open(log_path, "ab") as log:  # the child has its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd,
                env={**settings_env(settings), **(env or {})},
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        WorkerProcess.running.add(self)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)
        WorkerProcess.running.discard(self)

    def stop(self) -> None:
        WorkerProcess.running.discard(self)
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # whatever the worker left in its group (a beat child)


def eventually(condition: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Wait for a condition that has no event to wait on (e.g. a worker finishing its delivery)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


@atexit.register
def _kill_leftover_workers() -> None:
    """A test run that is interrupted must not leave worker processes behind."""
    for worker in list(WorkerProcess.running):
        worker._signal_group(signal.SIGKILL)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A new test: the last one's worker logs are no longer needed."""
    _remove_worker_logs()


@atexit.register
def _remove_worker_logs() -> None:
    for path in WorkerProcess.logs.values():
        path.unlink(missing_ok=True)
    WorkerProcess.logs.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test: add the logs of the worker processes it started. A turn that did not finish in time:
    also every thread's stack (an in-process worker's threads live here). So a hang seen once on a loaded CI
    machine can be read, not guessed."""
    outcome = yield
    from stepq.errors import WaitTimeoutError

    report = outcome.get_result()
    if report.failed and call.when == "call":
        for name, path in WorkerProcess.logs.items():
            tail = path.read_text(errors="replace")[-WORKER_LOG_TAIL:] if path.exists() else "(no log file)"
            report.sections.append((f"worker {name}'s log (its last {WORKER_LOG_TAIL:,} characters)", tail))
    if call.excinfo is None or not call.excinfo.errisinstance(WaitTimeoutError):
        return
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = [
        f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    ]
    report.sections.append(("threads when the wait timed out", "\n".join(stacks)))
