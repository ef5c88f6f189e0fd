"""The CLI's failures as a user meets them: one line on stderr, a non-zero exit code, never a traceback.

Every case runs the real `stepq` in a subprocess: Redis and the broker unreachable (a closed local port),
a missing output folder, a reader that went away, an agent module that fails to import, Ctrl-C.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import closed_port, settings_env
from tests.test_cli import ROOT, TIMEOUT, stepq_cmd, turn_id_of

PASSWORD = "s3cret-pw"  # in the unreachable Redis URL: it must never reach an error line


def embedded_env(**extra: str) -> dict[str, str]:
    """No STEPQ_REDIS_URL: the embedded mode, the state of a first-time user."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def run(env: dict[str, str], *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*stepq_cmd(), *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def assert_one_line_failure(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode not in (0, None), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{proc.stderr}"
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------- Redis and the broker unreachable


@pytest.fixture
def unreachable_env(tmp_path: Path) -> dict[str, str]:
    """STEPQ_REDIS_URL (with a password) at a closed port; STEPQ_REDIS_OUTAGE_S=0 so the client gives up at
    the first refusal."""
    port = closed_port()
    return embedded_env(
        STEPQ_REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
        STEPQ_REDIS_OUTAGE_S="0",
        STEPQ_AGENT_MODULES="stepq.agents.demo",
    )


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["batch", "status", "b-1"],
        ["approve", "apr_0123456789abcdef", "--yes"],
        ["batch", "--agent", "demo.support", "--input", "{tmp}/items.jsonl", "--output", "{tmp}/out.jsonl"],
    ],
    ids=["status", "batch-status", "approve", "batch"],
)
def test_redis_unreachable_is_one_line(unreachable_env, tmp_path, command):
    (tmp_path / "items.jsonl").write_text('{"key": "a", "prompt": "hello"}\n')
    args = [part.format(tmp=tmp_path) for part in command]
    proc = run(unreachable_env, *args)
    port = unreachable_env["STEPQ_REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
    line = assert_one_line_failure(proc, "stepq: error: cannot reach", port)
    assert proc.returncode == 1, line
    assert PASSWORD not in proc.stderr + proc.stdout
    assert not (tmp_path / "out.jsonl").exists()  # the batch stopped before touching its output


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["show", "turn_0123456789abcdef"],
        ["events", "turn_0123456789abcdef"],
        ["cancel", "turn_0123456789abcdef"],
        ["approve", "apr_0123456789abcdef", "--yes"],
        ["run", "demo.support", "hello"],
        ["batch", "status", "b-1"],
        ["batch", "wait", "b-1"],
        ["batch", "--agent", "demo.support", "--input", "{tmp}/items.jsonl", "--output", "{tmp}/out.jsonl"],
    ],
    ids=lambda c: "-".join(c[:2]) if c[0] == "batch" else c[0],
)
def test_a_redis_never_reached_fails_a_one_shot_command_without_waiting_the_outage_window(
    unreachable_env, tmp_path, command
):
    """STEPQ_REDIS_OUTAGE_S is (nearly) forever here: the command can end only because it gave up on a Redis it
    never reached, not because the window ran out (the subprocess's own timeout would fail the test)."""
    (tmp_path / "items.jsonl").write_text('{"key": "a", "prompt": "hello"}\n')
    env = {**unreachable_env, "STEPQ_REDIS_OUTAGE_S": "1000000000"}
    proc = run(env, *[part.format(tmp=tmp_path) for part in command])
    port = env["STEPQ_REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
    line = assert_one_line_failure(proc, "stepq: error: cannot reach Redis", port)
    assert proc.returncode == 1, line
    assert PASSWORD not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["cancel", "turn_0123456789abcdef", "--wait", "nan"],
        ["approve", "apr_0123456789abcdef", "--yes", "--timeout", "-1"],
        ["batch", "wait", "b-1", "--timeout", "nan"],
    ],
    ids=["cancel-wait-nan", "approve-timeout-negative", "batch-wait-timeout-nan"],
)
def test_a_wait_that_is_not_a_number_of_seconds_is_refused_before_anything_runs(settings, command):
    """A NaN wait was never reached (the command hung, then blamed Redis); a negative one reported giving up
    'after -1s'. Both are refused at parse time, naming the flag."""
    proc = run(settings_env(settings), *command)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: argument {command[-2]}: '{command[-1]}': seconds must be 0 or more" in proc.stderr


def test_store_unavailable_error_never_carries_the_redis_password():
    from stepq import Client, StoreUnavailableError
    from stepq.config.settings import Settings

    url = f"redis://:{PASSWORD}@127.0.0.1:{closed_port()}/0"
    client = Client(Settings(redis_url=url, redis_outage_s=0, agent_modules=["stepq.agents.demo"]))
    with pytest.raises(StoreUnavailableError) as info:
        client.get("t_0123456789abcdef")
    assert PASSWORD not in str(info.value)
    assert ":***@127.0.0.1" in str(info.value)


def test_broker_unreachable_in_approve_is_one_line(settings):
    env = settings_env(settings)
    env["STEPQ_BROKER_URL"] = f"redis://127.0.0.1:{closed_port()}/0"
    proc = run(env, "approve", "apr_0123456789abcdef", "deadbeef", "--yes")
    assert_one_line_failure(proc, "cannot reach the broker", env["STEPQ_BROKER_URL"])
    assert proc.returncode == 1  # a service down, not bad input


def test_approving_an_unknown_id_is_refused_at_once_without_a_worker(settings):
    """No worker runs here: the id has no approval record, so the refusal cannot be the worker's. (Before, the
    command sent the decision and waited its whole --timeout for a worker's `unknown`.)"""
    proc = run(settings_env(settings), "approve", "apr_0123456789abcdef", "--yes", "--timeout", "20")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "refused (unknown): unknown approval id 'apr_0123456789abcdef'", proc.stdout
    assert "Traceback" not in proc.stderr and "worker" not in proc.stderr, proc.stderr


def test_broker_unreachable_in_run_is_one_line_and_exit_1(settings):
    """Redis answers, the broker does not: the submit's BrokerUnavailableError is a service down (1), not bad input."""
    env = settings_env(settings)
    env["STEPQ_BROKER_URL"] = f"redis://127.0.0.1:{closed_port()}/0"
    proc = run(env, "run", "demo.support", "hello")
    assert_one_line_failure(proc, "cannot reach the broker", env["STEPQ_BROKER_URL"])
    assert proc.returncode == 1


# --------------------------------------------------------------------------- files, pipes, versions


def test_batch_output_into_a_missing_folder_is_one_line(tmp_path):
    (tmp_path / "items.jsonl").write_text('{"key": "a", "prompt": "hello"}\n')
    out = tmp_path / "missing" / "out.jsonl"
    proc = run(
        embedded_env(),
        "batch",
        "--agent",
        "demo.support",
        "--input",
        str(tmp_path / "items.jsonl"),
        "--output",
        str(out),
    )
    assert_one_line_failure(proc, "stepq batch:", str(out.parent))
    assert proc.returncode == 2
    assert not out.parent.exists()


@pytest.mark.parametrize(
    "args",
    [["worker", "--print-command"], ["run", "demo.support", "hello", "--json", "--deny-all"]],
    ids=["print-command", "embedded-run"],
)
def test_reader_gone_away_exits_quietly(tmp_path, args):
    """`stepq … | head` where head has already exited: the write fails with EPIPE; no traceback, no noise."""
    env = embedded_env(STEPQ_REDIS_URL="redis://127.0.0.1:6379/0") if args[0] == "worker" else embedded_env()
    read_end, write_end = os.pipe()
    os.close(read_end)  # every reader is gone before the first write: EPIPE on it, deterministically
    try:
        proc = subprocess.run(
            [*stepq_cmd(), *args],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


def test_version():
    proc = run(embedded_env(), "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"stepq {importlib.metadata.version('stepq')}"


# --------------------------------------------------------------------------- agent modules from the current directory

AGENT_MODULE = '''
import threading

from stepq.agents.definition import AgentDefinition
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.agents.tools import tool


@tool(timeout_s=None)
def wait_forever() -> str:
    """Never returns: the step stays running until the process ends."""
    threading.Event().wait()
    return "unreachable"


echo = AgentDefinition(id="cwd.echo", system_prompt="Say hi.", script=[ScriptStep(text="hi from the current directory")])
stuck = AgentDefinition(
    id="cwd.stuck",
    system_prompt="Wait.",
    allowed_tools=["wait_forever"],
    script=[ScriptStep(text="waiting", tool_calls=[ScriptToolCall(name="wait_forever", args={})])],
)
'''


def test_agent_module_in_the_current_directory_is_importable(tmp_path):
    (tmp_path / "myagents.py").write_text(AGENT_MODULE)
    proc = run(embedded_env(STEPQ_AGENT_MODULES="myagents"), "run", "cwd.echo", "hello", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == "hi from the current directory"


@pytest.mark.parametrize("command", ["run", "batch", "worker"])
def test_agent_module_that_fails_to_import_is_one_line(tmp_path, command):
    """The module is found in the current directory, and its own import fails: one line, no worker tracebacks
    (`stepq worker` says so before it execs celery, instead of a worker that fails every task)."""
    (tmp_path / "brokenagents.py").write_text("import a_module_that_does_not_exist_xyz\n")
    (tmp_path / "items.jsonl").write_text('{"key": "a", "prompt": "hello"}\n')
    env = embedded_env(STEPQ_AGENT_MODULES="brokenagents")
    if command == "run":
        proc = run(env, "run", "demo.support", "hello", cwd=tmp_path)
    elif command == "worker":
        proc = run({**env, "STEPQ_REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}, "worker", cwd=tmp_path)
    else:
        proc = run(
            env, "batch", "--agent", "demo.support", "--input", "items.jsonl", "--output", "out.jsonl", cwd=tmp_path
        )
    assert_one_line_failure(proc, "brokenagents", "a_module_that_does_not_exist_xyz")
    assert proc.returncode == 2


@pytest.mark.parametrize(
    ("fallbacks", "expected"),
    [
        ('[{"provider": "anthropic", "model": "claude"}, "gemni/flash"]', "entry 1 names unknown provider 'gemni'"),
        ('["anthropic-claude"]', "write it as provider/model"),
        ('[{"provider": "anthropic"}]', "model: field required"),
        ("[anthropic/claude", "not valid JSON"),
    ],
    ids=["unknown-provider", "no-slash", "no-model", "not-json"],
)
@pytest.mark.parametrize("command", ["status", "worker", "run"])
def test_bad_fallbacks_stop_a_process_at_start_in_one_line(tmp_path, command, fallbacks, expected):
    """STEPQ_FALLBACKS is read only when a step fails over, mid-outage: a typo must stop the process at start."""
    env = embedded_env(STEPQ_FALLBACKS=fallbacks, STEPQ_REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0")
    args = {"status": ["status"], "worker": ["worker"], "run": ["run", "demo.support", "hello"]}[command]
    proc = run(env, *args, cwd=tmp_path)
    assert_one_line_failure(proc, "STEPQ_FALLBACKS", expected)
    assert proc.returncode == 2


def test_known_fallbacks_are_accepted(tmp_path):
    env = embedded_env(
        STEPQ_FALLBACKS='["anthropic/claude", {"provider": "openai-compatible", "model": "m"}]',
        STEPQ_REDIS_URL="redis://127.0.0.1:6379/0",
    )
    proc = run(env, "worker", "--print-command", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- Ctrl-C on `stepq run`


class Watch:
    """Collects a pipe's text in a thread; `wait_for` blocks until some text has arrived (or the stream ends)."""

    def __init__(self, stream: int) -> None:
        self.text = ""
        self._changed = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        while chunk := os.read(fd, 4096):
            with self._changed:
                self.text += chunk.decode(errors="replace")
                self._changed.notify_all()
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def wait_for(self, needle: str, timeout: float = TIMEOUT) -> None:
        with self._changed:
            found = self._changed.wait_for(lambda: needle in self.text or self._done, timeout=timeout)
        assert found and needle in self.text, f"{needle!r} never came; got:\n{self.text}"

    def finish(self) -> str:
        self._thread.join(timeout=TIMEOUT)
        return self.text


def start(args: list[str], env: dict[str, str], cwd: Path, stdin: int) -> tuple[subprocess.Popen[bytes], Watch, Watch]:
    proc = subprocess.Popen(
        [*stepq_cmd(), *args], env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    return proc, Watch(proc.stdout.fileno()), Watch(proc.stderr.fileno())


def exit_code(proc: subprocess.Popen[bytes], out: Watch, errs: Watch) -> int:
    try:
        return proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after Ctrl-C\nstdout:\n{out.text}\nstderr:\n{errs.text}") from None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=TIMEOUT)


def test_ctrl_c_says_the_turn_goes_on(worker, settings, client):
    """With Redis the turn lives in the workers: Ctrl-C leaves it parked and says how to follow or cancel it."""
    primary, secondary = os.openpty()  # a terminal on stdin: the CLI asks about the refund and waits
    proc, out, errs = start(
        ["run", "demo.support", "refund order A-1001, please"], settings_env(settings), ROOT, secondary
    )
    try:
        out.wait_for("[y/N]")
        proc.send_signal(signal.SIGINT)
        assert exit_code(proc, out, errs) == 130
    finally:
        stop(proc)
        os.close(primary)
        os.close(secondary)
    text, stderr = out.finish(), errs.finish()
    turn_id = turn_id_of(text)
    assert "Traceback" not in stderr, stderr
    assert f"turn {turn_id} goes on" in stderr
    assert f"stepq events {turn_id}" in stderr and f"stepq cancel {turn_id}" in stderr
    assert client.get(turn_id).status == "awaiting_approval"  # still there, still waiting for its decision


def test_ctrl_c_twice_in_embedded_mode_exits_at_once(tmp_path):
    """Embedded, the turn ends with the process; the first Ctrl-C says so and stops the in-process worker,
    whose step never ends (a tool that waits forever): only the second Ctrl-C gets the user out."""
    (tmp_path / "myagents.py").write_text(AGENT_MODULE)
    env = embedded_env(STEPQ_AGENT_MODULES="myagents")
    proc, out, errs = start(["run", "cwd.stuck", "go"], env, tmp_path, subprocess.DEVNULL)
    try:
        out.wait_for("wait_forever")  # the tool call is on screen: the step is running it
        proc.send_signal(signal.SIGINT)
        errs.wait_for("Ctrl-C again")
        assert proc.poll() is None  # still stopping the worker: its step cannot finish
        proc.send_signal(signal.SIGINT)
        assert exit_code(proc, out, errs) == 130
    finally:
        stop(proc)
    stderr = errs.finish()
    assert "Traceback" not in stderr, stderr
    assert "stops with this process" in stderr


# --------------------------------------------------------------------------- an embedded run's terminal

FAILING_TOOL_MODULE = '''
from stepq.agents.definition import AgentDefinition
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.agents.tools import tool


@tool
def flaky_lookup(order: str) -> str:
    """Looks an order up; the upstream is down."""
    raise ConnectionError(f"upstream refused order {order}")


answer = AgentDefinition(
    id="term.answer",
    system_prompt="Look it up.",
    allowed_tools=["flaky_lookup"],
    script=[
        ScriptStep(text="", tool_calls=[ScriptToolCall(name="flaky_lookup", args={"order": "A-17"})]),
        ScriptStep(text="The lookup service is down; try again later."),
    ],
)
'''


def _embedded_run(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "termagents.py").write_text(FAILING_TOOL_MODULE)
    return run(embedded_env(STEPQ_AGENT_MODULES="termagents"), "run", "term.answer", "where is A-17?", cwd=tmp_path)


def test_an_embedded_run_shows_a_tool_error_in_one_line_without_its_traceback(tmp_path):
    proc = _embedded_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout + proc.stderr
    assert "Traceback" not in shown and 'File "' not in shown, shown
    [logged] = [line for line in proc.stderr.splitlines() if "flaky_lookup" in line]
    assert "raised ConnectionError: upstream refused order A-17" in logged, proc.stderr


def test_an_embedded_run_prints_the_answer_once(tmp_path):
    proc = _embedded_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("The lookup service is down; try again later.") == 1, proc.stdout
    assert "completed · finish: stop" in proc.stdout, proc.stdout  # the result's summary still follows
