"""`Client()` in embedded mode (STEPQ_REDIS_URL unset) runs turns by itself, and never hangs on one it cannot run.

Each case runs in a fresh interpreter, as an application would: embedded state and the in-process
worker belong to one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

TIMEOUT = 120


def run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def test_client_starts_a_worker_on_first_submit_and_close_stops_it(tmp_path: Path):
    proc = run_python(
        """
        from stepq import Client, embedded

        with Client() as client:
            print("before submit:", embedded.worker_running(client.settings))
            handle = client.submit("demo.extractor", prompt="Ada Lovelace, ada@engines.example")
            print("after submit:", embedded.worker_running(client.settings))
            result = handle.wait(timeout=60)
            print("result:", result.status, result.object["email"])
        print("after close:", embedded.worker_running(client.settings))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "before submit: False",
        "after submit: True",
        "result: completed ada@engines.example",
        "after close: False",
    ]


def test_a_client_shares_the_cli_worker_and_does_not_stop_it(tmp_path: Path):
    proc = run_python(
        """
        from stepq import Client, embedded

        client = Client()
        with embedded.local_worker(client.settings):
            handle = client.submit("demo.extractor", prompt="Ada")
            print(handle.wait(timeout=60).status)
            client.close()
            print("still running:", embedded.worker_running(client.settings))
        print("after the block:", embedded.worker_running(client.settings))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["completed", "still running: True", "after the block: False"]


def test_following_a_turn_no_worker_can_run_raises_no_worker_error(tmp_path: Path):
    """A closed client's turn: events() and wait() raise NoWorkerError instead of waiting forever."""
    proc = run_python(
        """
        from stepq import Client, NoWorkerError, StepqError, embedded
        from stepq.turns.submit import create_turn

        embedded.NO_WORKER_AFTER_S = 1.0  # the bound under test; the default is 15 s
        client = Client()
        state, _ = create_turn(client.runtime, "demo.support", prompt="refund A-1001")  # stored, never sent
        for call in (lambda: list(client.events(state.turn_id)), lambda: client.wait(state.turn_id)):
            try:
                call()
            except NoWorkerError as exc:
                assert isinstance(exc, StepqError) and isinstance(exc, TimeoutError)
                print(str(exc).replace(state.turn_id, "TURN"))
        print(client.get(state.turn_id).status)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0] == lines[1], proc.stdout
    assert lines[0].startswith("no worker has picked up turn TURN after 1 s: in embedded mode")
    assert "STEPQ_REDIS_URL" in lines[0]
    assert lines[2] == "queued"


def test_exit_without_close_while_a_turn_runs_is_clean(tmp_path: Path):
    """An application that submits and exits: the worker stops with the interpreter, no traceback."""
    proc = run_python(
        """
        from stepq import Client

        client = Client()
        client.submit("demo.support", prompt="refund A-1001")
        client.submit("demo.extractor", prompt="Ada")
        print("submitted")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "submitted\n"
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
