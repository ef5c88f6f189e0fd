"""`stepq serve` and `stepq demo --serve` at start, run as a user runs them: what stops them is one line."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ROOT, make_settings, settings_env
from tests.gateway_support import TIMEOUT, api_keys_setting

CLI = [sys.executable, "-m", "stepq.producer.cli"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
    )


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize("argv", [["serve", "--insecure-dev"], ["demo", "--serve"]], ids=["serve", "demo-serve"])
def test_a_taken_port_is_one_line_saying_how_to_choose_another(prefix, taken_port, argv):
    env = settings_env(make_settings(prefix, api_keys=api_keys_setting()))
    if argv[0] == "demo":
        env.pop("STEPQ_REDIS_URL")  # the demo as `make demo` runs it: embedded
    line = _one_line(_run([*argv, "--port", str(taken_port)], env))
    assert line.startswith(f"stepq: error: cannot listen on 127.0.0.1:{taken_port}: address already in use"), line
    assert "--port" in line and "Errno" not in line


@pytest.mark.parametrize("argv", [["serve", "--insecure-dev"], ["demo", "--serve"]], ids=["serve", "demo-serve"])
def test_a_port_out_of_range_or_an_address_not_of_this_machine_is_one_line(prefix, argv):
    """Before, a port past 65535 was the socket layer's OverflowError, reported as a bug in stepq; and an address
    the machine does not have was told to choose another port."""
    env = settings_env(make_settings(prefix, api_keys=api_keys_setting()))
    if argv[0] == "demo":
        env.pop("STEPQ_REDIS_URL")
    line = _one_line(_run([*argv, "--port", "99999"], env))
    assert line == "stepq: error: --port must be 0 (any free port) or a port number up to 65535, not 99999", line
    line = _one_line(_run([*argv, "--host", "192.0.2.1", "--port", "0"], env))  # TEST-NET-1: nobody's address
    assert line.startswith("stepq: error: cannot listen on 192.0.2.1:0: cannot assign requested address; "), line
    assert line.endswith(
        "give an address of this machine with --host" + (" or STEPQ_GATEWAY_HOST" if argv[0] == "serve" else "")
    ), line


def test_serve_refuses_a_generated_approval_secret(prefix):
    env = settings_env(make_settings(prefix, api_keys=api_keys_setting()))
    env.pop("STEPQ_APPROVAL_SECRET")
    line = _one_line(_run(["serve", "--port", "0"], env))
    assert "STEPQ_APPROVAL_SECRET is not set" in line and "export STEPQ_APPROVAL_SECRET=" in line, line
    assert "--insecure-dev" in line


def test_serve_insecure_dev_runs_on_a_generated_secret_and_says_how_to_set_one(prefix):
    settings = make_settings(prefix, api_keys=api_keys_setting())
    env = settings_env(settings)
    env.pop("STEPQ_APPROVAL_SECRET")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [*CLI, "serve", "--insecure-dev", "--port", str(port)], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    said = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if "Application startup complete" in line:
                break
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
            assert http.get("/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = "".join(said)
    assert "generated secret" in text and "export STEPQ_APPROVAL_SECRET=$(openssl rand -hex 32)" in text, text
