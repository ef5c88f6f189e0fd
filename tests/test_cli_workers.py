"""Several `stepq worker` processes on one host: each serves /metrics on its own port, and a SIGKILLed
worker leaves no beat scheduler, pool child or temporary directory behind. Real processes throughout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stepq.engine.runner import StepRunner
from stepq.fleet.heartbeat import live_workers
from stepq.models import TurnStatus
from stepq.turns.submit import create_turn
from tests.conftest import eventually, free_port, settings_env
from tests.test_cli import ROOT, stepq_cmd

WAIT_S = 120.0  # generous: the machine is shared and busy


class Worker:
    """`stepq worker` (exec'd into celery) in its own process group, its log in a file."""

    def __init__(self, env: dict[str, str], name: str | None, log: Path, *args: str) -> None:
        """`name` None: the worker picks its own node name, as `stepq worker` does by default."""
        self.name = name or ""
        self.log = log
        named = [f"--hostname={name}@%h"] if name else []
        with log.open("w") as sink:
            self.proc = subprocess.Popen(
                [*stepq_cmd(), "worker", *named, "--concurrency=1", "--loglevel=INFO", *args],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def info(self, rt: Any) -> dict[str, Any] | None:
        """The worker's heartbeat (it beats once /metrics is up and the pool is ready)."""
        return next(
            (w for w in live_workers(rt.redis, rt.settings.key_prefix) if w["name"].startswith(self.name)), None
        )

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)


def children(pid: int) -> set[int]:
    """Live child processes of `pid`, from /proc (the beat scheduler and pool children are forked by the worker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.add(int(entry.name))
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid = raw.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts: it runs no code)."""
    stat = _stat(pid)
    return stat is None or stat[0] == "Z"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        assert reply.status == 200
        return str(reply.read().decode())


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_two_workers_with_the_same_metrics_port_both_serve(settings, rt, tmp_path):
    """STEPQ_METRICS_PORT is a base: the second worker on the host takes the next free port and says so."""
    env = settings_env(settings)
    env["STEPQ_METRICS_PORT"] = str(free_port())
    workers = [Worker(env, f"m{i}-{settings.key_prefix}", tmp_path / f"w{i}.log", "--no-beat") for i in (1, 2)]
    try:
        eventually(lambda: all(w.info(rt) for w in workers), timeout=WAIT_S, what="both workers' heartbeats")
        ports = [w.info(rt)["metrics_port"] for w in workers]  # type: ignore[index]
        assert len(set(ports)) == 2 and int(env["STEPQ_METRICS_PORT"]) in ports, ports
        for port in ports:
            assert "stepq_" in scrape(port)
        logs = "".join(w.log.read_text() for w in workers)
        assert "cannot serve /metrics" not in logs and "Traceback" not in logs, logs
        moved = max(ports)
        assert f"serving /metrics on 0.0.0.0:{moved} (STEPQ_METRICS_PORT={env['STEPQ_METRICS_PORT']} is taken" in logs
    finally:
        for w in workers:
            w.kill_group()


def test_two_workers_on_one_host_are_both_listed_by_status(settings, rt, tmp_path):
    """Without --hostname each `stepq worker` gets its own node name (not `celery@<host>` for all of them)."""
    env = settings_env(settings)
    env["STEPQ_METRICS_PORT"] = "0"
    env.pop("STEPQ_APPROVAL_SECRET")  # and a worker without one says so at start, with the command to set one
    workers = [Worker(env, None, tmp_path / f"w{i}.log", "--no-beat") for i in (1, 2)]
    try:
        eventually(lambda: len(live_workers(rt.redis, settings.key_prefix)) == 2, timeout=WAIT_S, what="2 workers")
        status = subprocess.run(
            [*stepq_cmd(), "status", "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S
        )
        assert status.returncode == 0, status.stderr
        names = sorted(w["name"] for w in json.loads(status.stdout)["workers"])
        host = socket.gethostname()
        assert names == sorted(f"stepq-{w.proc.pid}@{host}" for w in workers), names
        for w in workers:
            logged = w.log.read_text()
            assert "STEPQ_APPROVAL_SECRET is not set" in logged and "export STEPQ_APPROVAL_SECRET=" in logged, logged
    finally:
        for w in workers:
            w.kill_group()


def test_the_sweeper_logs_what_it_did_and_nothing_when_it_did_nothing(settings, rt, prefix, tmp_path):
    """At INFO a worker's log has one line per turn the sweeper re-sent, and none for the sweeps in between
    (Celery logged three lines for every one, every STEPQ_SWEEP_INTERVAL_S)."""
    env = settings_env(settings)
    env["STEPQ_METRICS_PORT"] = "0"
    worker = Worker(env, f"s-{settings.key_prefix}", tmp_path / "worker.log", "--beat")
    try:
        eventually(lambda: worker.info(rt) is not None, timeout=WAIT_S, what="the worker's heartbeat")
        state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
        assert StepRunner(rt).deliver(state.turn_id, 0).step == 1  # committed; its message is never sent
        rt.turns.indexes.add("active", state.turn_id, 0)  # as if committed one lease TTL ago
        done = lambda: rt.turns.load(state.turn_id).status == TurnStatus.COMPLETED  # noqa: E731
        eventually(done, timeout=WAIT_S, what="the sweeper to re-send the turn and the worker to finish it")
        for _ in range(2):  # two more sweeps, with nothing to do: each takes the sweep lock
            rt.redis.delete(rt.keys.sweep_lock)
            eventually(lambda: rt.redis.exists(rt.keys.sweep_lock), timeout=WAIT_S, what="another sweep")
    finally:
        worker.kill_group()
    logged = worker.log.read_text()
    assert "stepq.sweep[" not in logged and "Sending due task stepq-sweep" not in logged, logged
    # the re-sent step logged its own line (turn, step), not Celery's "received" / "succeeded" beside it
    assert "stepq.run_step[" not in logged, logged
    assert "step delivery ended" in logged, logged
    swept = [line for line in logged.splitlines() if "sweeper" in line]
    assert len(swept) == 1 and "INFO" in swept[0], logged
    assert f"re-sent turn {state.turn_id} step 1 (its step message was never sent)" in swept[0]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_sigkilled_worker_leaves_no_beat_child(settings, rt, tmp_path):
    """The `-B` beat child dies with its worker, even one killed with SIGKILL (no orphan keeps sweeping)."""
    env = settings_env(settings)
    env["STEPQ_METRICS_PORT"] = "0"
    env["TMPDIR"] = str(tmp_path)  # anything the worker writes to the temp dir lands here, where we can see it
    worker = Worker(env, f"b-{settings.key_prefix}", tmp_path / "worker.log", "--beat")
    try:
        eventually(lambda: worker.info(rt) is not None and children(worker.proc.pid), timeout=WAIT_S, what="beat")
        (beat,) = children(worker.proc.pid)  # the threads pool forks nothing else
        os.kill(worker.proc.pid, signal.SIGKILL)  # the worker alone, not its process group
        worker.proc.wait(timeout=WAIT_S)
        eventually(lambda: gone(beat), timeout=WAIT_S, what=f"the beat child {beat} to exit")
        assert [p.name for p in tmp_path.iterdir() if p.name != "worker.log"] == []  # no schedule file or dir
    finally:
        worker.kill_group()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_sigkilled_prefork_worker_leaves_no_children_and_its_metrics_dir_is_cleaned(settings, rt, tmp_path):
    """Prefork: the pool children and the beat end with a SIGKILLed worker; its multiprocess metrics directory
    (which it could not delete) is deleted by the next `stepq worker` on the host."""
    env = settings_env(settings)
    env["STEPQ_METRICS_PORT"] = "0"
    env["TMPDIR"] = str(tmp_path)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    first = Worker(env, f"p1-{settings.key_prefix}", tmp_path / "first.log", "--pool=prefork", "--beat")
    try:
        eventually(lambda: len(children(first.proc.pid)) == 2, timeout=WAIT_S, what="a pool child and the beat")
        eventually(lambda: first.info(rt) is not None, timeout=WAIT_S, what="the first worker's heartbeat")
        forked = children(first.proc.pid)
        (stale,) = tmp_path.glob("stepq-metrics-*")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=WAIT_S)
        for pid in forked:
            eventually(lambda pid=pid: gone(pid), timeout=WAIT_S, what=f"child {pid} of the killed worker to exit")
        assert stale.exists()  # nobody ran the killed worker's clean-up
    finally:
        first.kill_group()

    second = Worker(env, f"p2-{settings.key_prefix}", tmp_path / "second.log", "--pool=prefork", "--no-beat")
    try:
        eventually(lambda: second.info(rt) is not None, timeout=WAIT_S, what="the second worker's heartbeat")
        assert not stale.exists()
        (own,) = tmp_path.glob("stepq-metrics-*")
        second.proc.send_signal(signal.SIGTERM)  # a clean stop deletes the worker's own directory
        second.proc.wait(timeout=WAIT_S)
        assert not own.exists()
    finally:
        second.kill_group()


def test_celery_worker_loads_agent_modules_from_the_current_directory(settings, rt, tmp_path):
    """`celery -A stepq.workers.celery_app worker`, started where the agent module lives, runs its agent."""
    from tests.test_cli_errors import AGENT_MODULE

    (tmp_path / "myagents.py").write_text(AGENT_MODULE)
    env = settings_env(settings)
    env.pop("PYTHONPATH", None)
    env.update(STEPQ_AGENT_MODULES="myagents", STEPQ_METRICS_PORT="0")
    name = f"c-{settings.key_prefix}"
    with (tmp_path / "worker.log").open("w") as sink:
        celery = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("celery")),
                "-A",
                "stepq.workers.celery_app",
                "worker",
                "--pool=threads",
                "--concurrency=1",
                "--loglevel=WARNING",
                f"--hostname={name}@%h",
                "-Q",
                settings.queue,
            ],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc = subprocess.run(
            [*stepq_cmd(), "run", "cwd.echo", "hello", "--json"],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        log = (tmp_path / "worker.log").read_text()
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\nworker log:\n{log}"
        assert json.loads(proc.stdout)["text"] == "hi from the current directory"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(celery.pid, signal.SIGKILL)
        celery.wait(timeout=WAIT_S)
