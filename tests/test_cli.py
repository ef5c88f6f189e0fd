"""The `stepq` CLI as a user runs it: a subprocess against real Redis and a real Celery worker."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

from stepq.config.settings import Settings
from tests.conftest import ROOT, settings_env

TIMEOUT = 120


def stepq_cmd() -> list[str]:
    script = Path(sys.executable).with_name("stepq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stepq.producer.cli"]


def stepq(
    env: dict[str, str], *args: str, stdin: str | None = None, check: int | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*stepq_cmd(), *args],
        env=env,
        cwd=ROOT,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture
def env(settings) -> dict[str, str]:
    return settings_env(settings)


def turn_id_of(output: str) -> str:
    found = re.search(r"\b(turn_[0-9a-f]{32})\b", output)
    assert found, output
    return found.group(1)


def parked_turn(client, prefix: str) -> tuple[str, dict]:
    """A demo.support turn parked on its refund approval; returns (turn id, approval-request data)."""
    handle = client.submit("demo.support", prompt="refund A-1001", metadata={"prefix": prefix})
    for event in handle.events(idle_timeout=60):
        if event.type == "approval-request":
            return handle.turn_id, event.data
    raise AssertionError("the turn finished without asking for approval")


def test_run_json_completes(worker, env):
    proc = stepq(env, "run", "rt.basic", "hi", "--json", check=0)
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert result["finish_reason"] == "stop"
    assert result["text"] == "all done here, thanks"
    assert [s["tool_calls"] for s in result["trace"]["steps"]] == [["rt_echo"], []]
    assert result["usage"]["input_tokens"] > 0


def test_run_unknown_agent_is_bad_input(env):
    proc = stepq(env, "run", "nope.missing", "hi", check=2)
    assert "nope.missing" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_run_bad_metadata_is_bad_input(env):
    proc = stepq(env, "run", "rt.basic", "hi", "--metadata", "[1, 2]", check=2)
    assert "--metadata must be a JSON object" in proc.stderr


def test_run_widening_override_is_bad_input(env):
    proc = stepq(env, "run", "rt.basic", "hi", "--max-steps", "1000", check=2)
    assert "max_steps=1000" in proc.stderr and "only tighten" in proc.stderr


def test_run_failed_turn_shows_retries_and_exits_1(worker, env):
    proc = stepq(env, "run", "rt.always_failing", "hi", check=1)
    assert proc.stdout.count("↻ step 0 retry") == 4  # STEPQ_RETRY_MAX_ATTEMPTS=5: four retries, then it fails
    assert "503" in proc.stdout and "unavailable" in proc.stdout
    assert "✗ error: provider error after 5 attempts" in proc.stdout
    assert "failed · finish: error" in proc.stdout


def test_run_approve_all_then_show_and_events(worker, env):
    proc = stepq(env, "run", "demo.support", "my grinder broke, refund please", "--approve-all", check=0)
    out = proc.stdout
    assert "Let me look that order up." in out  # streamed text
    assert "→ lookup_order" in out
    assert "approval needed for issue_refund" in out
    assert "✓ approved by cli" in out
    assert '"refund_id": "R-' in out  # the refund ran after the approval
    assert "completed · finish: stop" in out
    turn_id = turn_id_of(out)

    shown = stepq(env, "show", turn_id, check=0).stdout
    assert "completed" in shown and "demo.support" in shown and "function / function" in shown
    assert "Done: the refund is on its way." in shown
    assert "provider/model" in shown and "issue_refund" in shown  # the per-step trace table

    as_json = json.loads(stepq(env, "show", turn_id, "--json", check=0).stdout)
    assert as_json["status"] == "completed"
    assert [s["tool_calls"] for s in as_json["trace"]["steps"]] == [["lookup_order"], ["issue_refund"], []]

    listed = stepq(env, "events", turn_id, "--no-follow", check=0).stdout
    kinds = [line.split()[3] for line in listed.splitlines()]
    assert kinds[0] == "turn-start" and kinds[-1] == "turn-finish"
    assert {"tool-call", "tool-result", "approval-request", "approval-decision", "text-delta"} <= set(kinds)
    # the function model streams each call's arguments: one line per piece, naming the tool and the call
    pieces = [line for line in listed.splitlines() if line.split()[3] == "tool-input-delta"]
    assert pieces and all(line.split()[4] in ("lookup_order", "issue_refund") for line in pieces)
    assert all("(id call_" in line for line in pieces)

    followed = stepq(env, "events", turn_id, "--json", "--after", "3", check=0).stdout
    events = [json.loads(line) for line in followed.splitlines()]
    assert events[0]["seq"] == 4
    assert [e["seq"] for e in events] == list(range(4, 4 + len(events)))
    assert events[-1]["type"] == "turn-finish"


def test_run_deny_all_model_sees_denial(worker, env):
    proc = stepq(env, "run", "demo.support", "refund order A-1001, please", "--deny-all", "--json", check=0)
    result = json.loads(proc.stdout)
    assert result["approvals"] == [
        {
            "approval_id": result["approvals"][0]["approval_id"],
            "tool": "issue_refund",
            "args": {"order_id": "A-1001", "amount_eur": 129.0},
            "approved": False,
            "accepted": True,
        }
    ]
    events = stepq(env, "events", result["turn_id"], "--json", check=0).stdout
    results = [e["data"] for e in map(json.loads, events.splitlines()) if e["type"] == "tool-result"]
    refund = [r for r in results if r["name"] == "issue_refund"]
    assert len(refund) == 1 and refund[0]["is_error"]
    assert refund[0]["output"]["error"].startswith("denied by reviewer: denied with --deny-all")


def test_run_without_a_terminal_denies_instead_of_hanging(worker, env):
    proc = stepq(env, "run", "demo.support", "refund order A-1001, please", check=0)
    assert "stdin is not a terminal" in proc.stderr
    assert "denied by reviewer: no reviewer" in proc.stdout


def test_run_interactive_answer_from_stdin_pipe_is_not_trusted(worker, env):
    # a pipe is not a terminal: even a "y" on stdin must not approve a write
    proc = stepq(env, "run", "demo.support", "refund order A-1001, please", stdin="y\n", check=0)
    assert "✗ denied by cli" in proc.stdout


def test_run_asks_at_the_terminal(worker, env):
    primary, secondary = os.openpty()  # a real terminal on stdin: the CLI asks, we answer
    try:
        proc = subprocess.Popen(
            [*stepq_cmd(), "run", "demo.support", "refund order A-1001, please"],
            env=env,
            cwd=ROOT,
            stdin=secondary,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(primary, b"y\nlooks right\n")
        out, errs = proc.communicate(timeout=TIMEOUT)
    finally:
        os.close(primary)
        os.close(secondary)
    assert proc.returncode == 0, out + errs
    assert 'Approve issue_refund {"order_id": "A-1001", "amount_eur": 129.0}?' in out
    assert re.search(r"✓ approved by \S+: looks right", out), out
    assert '"refund_id": "R-' in out


def test_approve_tampered_token_is_refused_then_valid_one_accepted(worker, env, client, prefix):
    turn_id, request = parked_turn(client, prefix)
    shown = stepq(env, "show", turn_id, check=0).stdout
    assert "awaiting_approval" in shown
    assert f"stepq approve {request['approval_id']} --yes" in shown
    assert "token" not in request  # events carry no token; an operator's CLI reads it from the approval's record

    token = client.runtime.approvals.get(request["approval_id"]).token
    tampered = token[:-1] + ("0" if token[-1] != "0" else "1")
    proc = stepq(env, "approve", request["approval_id"], tampered, "--yes", check=1)
    assert "refused (invalid-token)" in proc.stdout
    assert client.get(turn_id).status == "awaiting_approval"

    proc = stepq(env, "approve", request["approval_id"], "--yes", "--reason", "ok", "--reviewer", "ana", check=0)
    assert "accepted" in proc.stdout
    assert client.wait(turn_id, timeout=60).status == "completed"

    proc = stepq(env, "approve", request["approval_id"], token, "--no", check=1)
    assert "refused (not-pending)" in proc.stdout


def test_cancel_parked_turn(worker, env, client, prefix):
    turn_id, _ = parked_turn(client, prefix)
    proc = stepq(env, "cancel", turn_id, check=0)
    assert f"turn {turn_id} cancelled" in proc.stdout
    assert client.get(turn_id).status == "cancelled"
    assert "already cancelled" in stepq(env, "cancel", turn_id, check=0).stdout


@pytest.mark.parametrize("command", ["show", "events", "cancel"])
def test_unknown_turn_is_bad_input(env, command):
    proc = stepq(env, command, "turn_doesnotexist", check=2)
    assert "turn_doesnotexist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_worker_command_line(env, settings):
    cmd = shlex.split(stepq(env, "worker", "--print-command", check=0).stdout)
    assert cmd[1:6] == ["-m", "celery", "-A", "stepq.workers.celery_app", "worker"]
    assert "--pool=threads" in cmd and "--concurrency=32" in cmd
    assert cmd[cmd.index("-Q") + 1] == f"{settings.queue},{settings.queue}.batch"
    assert "-B" in cmd and "--scheduler=celery.beat:Scheduler" in cmd  # in memory: no schedule file left behind
    cmd = shlex.split(stepq(env, "worker", "--no-beat", "--queues", "a,b", "--print-command", check=0).stdout)
    assert "-B" not in cmd and cmd[cmd.index("-Q") + 1] == "a,b"
    cmd = shlex.split(stepq(env, "worker", "--pool", "gevent", "--no-beat", "--print-command", check=0).stdout)
    assert "--pool=gevent" in cmd and "-B" not in cmd
    refused = stepq(env, "worker", "--pool", "gevent", "--print-command", check=2).stderr  # celery refuses -B there
    assert "--no-beat" in refused and len(refused.strip().splitlines()) == 1 and "Traceback" not in refused
    assert "invalid choice: 'eventlet'" in stepq(env, "worker", "--pool", "eventlet", check=2).stderr
    for flags, said in [
        (["--concurrency", "0"], "--concurrency must be at least 1 (concurrent steps), not 0"),  # celery: one per CPU
        (["--concurrency", "-2"], "--concurrency must be at least 1 (concurrent steps), not -2"),
        (["--metrics-port", "70000"], "--metrics-port must be 0 (off) or a port number up to 65535, not 70000"),
    ]:
        refused = stepq(env, "worker", *flags, "--print-command", check=2).stderr
        assert refused.strip() == f"stepq: error: {said}", refused


def test_worker_refuses_embedded_mode():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    proc = stepq(env, "worker", check=2)
    assert "STEPQ_REDIS_URL" in proc.stderr and "stepq demo" in proc.stderr


def test_stepq_worker_runs_turns(env, tmp_path):
    """`stepq worker` (exec'd into celery) serves turns submitted by `stepq run`."""
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(
            [*stepq_cmd(), "worker", "--concurrency=2", "--loglevel=WARNING", "--no-beat"],
            env=env,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        proc = stepq(env, "run", "rt.basic", "hi", "--json")
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\nworker log:\n{log.read_text()}"
        assert json.loads(proc.stdout)["status"] == "completed"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


# settings read from a family of variables rather than one: the reference names the family
VARIABLE_FAMILIES = {"module_models": "`STEPQ_<MODULE>_PROVIDER` / `STEPQ_<MODULE>_MODEL`"}


_TYPE_WORDS: dict[object, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _shown_default(value: object) -> str:
    """The start of the default as the reference shows it: `true`, `16`, `stepq`; unset; other values vary."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float | str):
        return f"`{int(value) if isinstance(value, float) and value.is_integer() else value}`"
    return ""


def test_settings_reference_documents_every_setting():
    """docs/reference/settings.md's generated part has a section per field of Settings: its variable, its type,
    its default and its description (the field's docstring), none of them left out."""
    sys.path.insert(0, str(ROOT / "docs" / "_gen"))
    from stepq_docgen import settings_ref

    page = settings_ref.render()
    found = {
        heading: body
        for heading, body in re.findall(r"^### ([^\n]+)\n\n(.*?)(?=^##|\Z)", page, re.MULTILINE | re.DOTALL)
    }
    for name, field in Settings.model_fields.items():
        heading = VARIABLE_FAMILIES.get(name, f"`STEPQ_{name.upper()}`")
        assert heading in found, f"the settings reference lacks {heading}"
        body = found[heading]
        optional = isinstance(field.annotation, types.UnionType)  # `int | None`: the type without None
        plain = (
            [a for a in typing.get_args(field.annotation) if a is not type(None)] if optional else [field.annotation]
        )
        assert f"**Type:** {_TYPE_WORDS.get(plain[0], '')}" in body, f"{heading}: {body!r}"
        assert f"**Default:** {_shown_default(field.get_default(call_default_factory=True))}" in body, (
            f"{heading}: {body!r}"
        )
        assert field.description, f"Settings.{name} has no docstring: the reference has nothing to say about it"
        assert " ".join(field.description.split())[:40] in " ".join(body.split()).replace("&lt;", "<").replace(
            "&gt;", ">"
        )
    assert len(found) == len(Settings.model_fields)
