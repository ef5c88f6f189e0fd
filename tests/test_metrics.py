"""/metrics scraped over HTTP from real `stepq worker` processes (threads and prefork) after real turns."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from typing import IO

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stepq.config.settings import Settings
from stepq.fleet.runtime import Runtime
from stepq.models import EventType, TurnStatus
from tests.conftest import ROOT, eventually, free_port, settings_env
from tests.test_cli import stepq_cmd

TIMEOUT = 60.0


class LineWatcher:
    """Drains a stream on a thread (so the child never blocks on a full pipe) and lets a test wait for a line."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_for(self, text: str, timeout: float = TIMEOUT) -> str:
        def found() -> str | None:
            return next((line for line in self.lines if text in line), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None or self._closed, timeout):
                raise AssertionError(f"no line with {text!r} within {timeout}s:\n" + "\n".join(self.lines[-40:]))
            line = found()
            if line is None:
                raise AssertionError(f"the stream closed without {text!r}:\n" + "\n".join(self.lines[-40:]))
            return line

    def join(self) -> list[str]:
        self._thread.join(timeout=TIMEOUT)
        return list(self.lines)


class StepqWorker:
    """`stepq worker` (exec'd into celery) as a subprocess, its stderr watched line by line."""

    def __init__(self, settings: Settings, name: str, *args: str, **env: str) -> None:
        self.name = f"{name}@{socket.gethostname()}"
        environ = settings_env(settings)
        environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        environ.update(env)
        cmd = [*stepq_cmd(), "worker", "--no-beat", f"--hostname={self.name}", *args]
        self.proc = subprocess.Popen(
            cmd, env=environ, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        assert self.proc.stderr is not None
        self.stderr = LineWatcher(self.proc.stderr)

    def stop(self) -> list[str]:
        """Warm shutdown; returns every stderr line."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.stderr.join()


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and wanted <= ls)


@pytest.fixture
def metrics_worker(request, settings: Settings) -> Iterator[tuple[StepqWorker, int]]:
    pool, concurrency = request.param
    port = free_port()
    worker = StepqWorker(
        settings,
        f"metrics-{pool}",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        "--loglevel=INFO",
        STEPQ_METRICS_PORT=str(port),
        STEPQ_METRICS_HOST="127.0.0.1",
    )
    try:
        worker.stderr.wait_for("serving /metrics on")
        yield worker, port
    finally:
        worker.stop()


@pytest.mark.parametrize("metrics_worker", [("threads", 4), ("prefork", 2)], indirect=True, ids=["threads", "prefork"])
def test_metrics_count_retries_approvals_and_tool_errors(metrics_worker, client, prefix: str, rt: Runtime) -> None:
    worker, port = metrics_worker
    before = scrape(port)

    retried = client.submit("rt.rate_limited", prompt="go")
    failing_tools = client.submit("mt.tool_error", prompt="go")
    gated = client.submit("rt.approver", prompt="go", metadata={"prefix": prefix})
    request = next(e for e in gated.events(idle_timeout=TIMEOUT) if e.type == EventType.APPROVAL_REQUEST)

    parked = scrape(port)  # the scrape-time gauges read Redis now
    assert value(parked, "stepq_pending_approvals") == 1
    assert client.approve(request.data["approval_id"], True).wait(TIMEOUT)
    for handle in (retried, failing_tools, gated):
        assert handle.wait(timeout=TIMEOUT).status == TurnStatus.COMPLETED

    # a step is counted when its delivery returns, just after the turn-finish event a waiter sees
    scraped: list[dict[tuple[str, frozenset[tuple[str, str]]], float]] = []

    def last_steps_counted() -> bool:
        scraped[:] = [scrape(port)]
        count = "stepq_step_duration_seconds_count"
        return value(scraped[-1], count, provider="scripted") - value(before, count, provider="scripted") >= 6

    eventually(last_steps_counted, TIMEOUT, "the worker to count the turns' last steps")
    after = scraped[-1]

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for agent in ("rt.rate_limited", "mt.tool_error", "rt.approver"):
        assert delta("stepq_turns_total", agent=agent, status="completed") == 1, agent
    # model steps: rate_limited 1 retry + 1 ok; tool_error 2 ok; approver 1 parked + 1 ok
    assert delta("stepq_steps_total", agent="rt.rate_limited", provider="scripted", outcome="retry") == 1
    assert delta("stepq_steps_total", agent="rt.rate_limited", outcome="ok") == 1
    assert delta("stepq_steps_total", agent="mt.tool_error", outcome="ok") == 2
    assert delta("stepq_steps_total", agent="rt.approver", outcome="parked") == 1
    assert delta("stepq_steps_total", agent="rt.approver", outcome="ok") == 1
    assert delta("stepq_steps_total") == 6
    assert delta("stepq_step_duration_seconds_count", provider="scripted") == 6
    assert delta("stepq_time_to_first_chunk_seconds_count", provider="scripted") == 5  # the 429 sent no chunk
    assert delta("stepq_step_retries_total", provider="scripted", reason="429") == 1
    assert delta("stepq_tokens_total", provider="scripted", kind="input") > 0
    assert delta("stepq_tokens_total", provider="scripted", kind="output") > 0

    assert delta("stepq_tool_calls_total", agent="mt.tool_error", tool="mt_boom", outcome="error") == 1
    assert delta("stepq_tool_calls_total", agent="mt.tool_error", tool="mt_boom", outcome="invalid_args") == 1
    assert delta("stepq_tool_calls_total", agent="mt.tool_error", tool="unknown", outcome="not_found") == 1
    assert delta("stepq_tool_calls_total", agent="rt.approver", tool="rt_echo", outcome="ok") == 1
    assert delta("stepq_tool_calls_total", agent="rt.approver", tool="rt_side_effect", outcome="ok") == 1
    assert not [ls for (n, ls) in after if n == "stepq_tool_calls_total" and ("tool", "mt_invented") in ls]

    assert delta("stepq_step_deliveries_total", action="retry") == 1
    assert value(after, "stepq_pending_approvals") == 0
    depth = {dict(ls)["queue"]: v for (n, ls), v in after.items() if n == "stepq_queue_depth"}
    assert depth == {rt.settings.queue: 0, f"{rt.settings.queue}.batch": 0}

    from stepq.producer.status import collect_status

    prefork = "--pool=prefork" in worker.proc.args
    [me] = [w for w in collect_status(rt)["workers"] if w["name"] == worker.name]  # its heartbeat
    assert me["pool"] == ("prefork" if prefork else "threads") and me["metrics_port"] == port

    # prefork: `stepq worker` gave celery a multiprocess dir of its own, and the worker removes it on exit
    multiproc_dir = _environ(worker.proc.pid).get("PROMETHEUS_MULTIPROC_DIR")
    assert bool(multiproc_dir) == prefork
    worker.stop()
    assert not [w for w in collect_status(rt)["workers"] if w["name"] == worker.name]
    if multiproc_dir:
        assert not os.path.exists(multiproc_dir)


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = [e.decode(errors="replace") for e in f.read().split(b"\0") if b"=" in e]
    return dict(e.split("=", 1) for e in entries)
