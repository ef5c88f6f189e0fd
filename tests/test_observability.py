"""Seeing a turn and the fleet: `stepq show --trace`, `stepq status`, structured and redacted logs."""

from __future__ import annotations

import json
import re
import secrets

import pytest

from stepq.agents.fingerprint import version_of
from stepq.config.settings import Settings
from stepq.fleet.metrics import StateCollector, pending_approval_count
from stepq.fleet.runtime import Runtime
from stepq.models import EventType, TurnStatus
from stepq.producer.status import collect_status
from tests.conftest import settings_env
from tests.test_cli import stepq
from tests.test_metrics import TIMEOUT, StepqWorker


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    return settings_env(settings)


def test_show_trace_prints_one_row_per_step(worker, client, env) -> None:
    basic = client.submit("rt.basic", prompt="hi")
    retried = client.submit("rt.rate_limited", prompt="go")
    assert basic.wait(timeout=TIMEOUT).status == TurnStatus.COMPLETED
    assert retried.wait(timeout=TIMEOUT).status == TurnStatus.COMPLETED

    header, *lines = stepq(env, "show", basic.turn_id, "--trace", check=0).stdout.splitlines()
    rows = [line for line in lines if not line.lstrip().startswith("↳")]  # a step's detail lines follow its row
    assert header.split() == [
        *("step", "provider/model", "tool", "calls", "in", "out", "cost", "retries", "time", "stop", "agent", "version")
    ]
    assert [r.split()[0] for r in rows] == ["0", "1"]
    assert all("scripted/scripted" in r for r in rows)
    assert "rt_echo" in rows[0] and rows[0].split()[-2] == "tool-calls" and rows[1].split()[-2] == "stop"
    fingerprint = version_of(client.runtime.agents.get("rt.basic")).short  # the definition each step ran under
    assert [r.split()[-1] for r in rows] == [fingerprint, fingerprint]

    [step] = json.loads(stepq(env, "show", retried.turn_id, "--trace", "--json", check=0).stdout)
    assert step["step"] == 0 and step["retries"] == 1 and step["stop_reason"] == "stop"
    assert step["usage"]["input_tokens"] > 0 and step["provider"] == "scripted"


def test_status_lists_a_parked_turns_pending_approval(worker, client, prefix: str, rt: Runtime, env) -> None:
    handle = client.submit("rt.approver", prompt="go", metadata={"prefix": prefix})
    request = next(e for e in handle.events(idle_timeout=TIMEOUT) if e.type == EventType.APPROVAL_REQUEST)

    status = json.loads(stepq(env, "status", "--json", check=0).stdout)
    parked = status["awaiting_approval"]
    assert parked["count"] == 1 and parked["pending_approvals"] == 1
    [turn] = parked["turns"]
    assert turn["turn_id"] == handle.turn_id and turn["agent"] == "rt.approver"
    [approval] = turn["approvals"]
    assert approval["approval_id"] == request.data["approval_id"]
    assert approval["tool"] == "rt_side_effect" and approval["status"] == "pending"
    assert approval["expires_at"] == request.data["expires_at"] and approval["expires_in_s"] > 0
    assert status["active_turns"]["count"] == 0  # parked turns hold no worker

    text = stepq(env, "status", check=0).stdout
    assert request.data["approval_id"] in text and "1 pending approvals" in text

    assert client.approve(request.data["approval_id"], False).wait(TIMEOUT)
    assert handle.wait(timeout=TIMEOUT).status == TurnStatus.COMPLETED
    after = collect_status(rt)["awaiting_approval"]  # what `status --json` prints, without another process
    assert after == {"count": 0, "pending_approvals": 0, "turns": []}


def test_cancelling_a_parked_turn_clears_its_pending_approvals(worker, client, prefix: str, rt: Runtime) -> None:
    handle = client.submit("rt.approver", prompt="go", metadata={"prefix": prefix})
    next(e for e in handle.events(idle_timeout=TIMEOUT) if e.type == EventType.APPROVAL_REQUEST)
    assert pending_approval_count(rt.redis, rt.keys.prefix) == 1
    handle.cancel()
    assert handle.wait(timeout=TIMEOUT).status == TurnStatus.CANCELLED
    assert pending_approval_count(rt.redis, rt.keys.prefix) == 0


def test_status_and_gauge_show_waiting_messages_with_no_worker(client, settings: Settings, rt: Runtime, env):
    handles = [client.submit("rt.basic", prompt=f"hi {i}") for i in range(3)]
    batch = client.submit("rt.basic", prompt="later", priority="batch")

    status = json.loads(stepq(env, "status", "--json", check=0).stdout)
    depths = {q["name"]: q["depth"] for q in status["queues"]}
    assert depths == {settings.queue: 3, f"{settings.queue}.batch": 1}
    assert status["workers"] == []
    active = status["active_turns"]
    assert active["count"] == 4
    assert {t["turn_id"] for t in active["turns"]} == {h.turn_id for h in [*handles, batch]}
    assert {t["status"] for t in active["turns"]} == {"queued"}

    gauges = {
        (m.name, tuple(s.labels.values())): s.value for m in StateCollector(settings).collect() for s in m.samples
    }
    assert gauges[("stepq_queue_depth", (settings.queue,))] == 3
    assert gauges[("stepq_queue_depth", (f"{settings.queue}.batch",))] == 1
    assert gauges[("stepq_pending_approvals", ())] == 0


def test_json_logs_carry_step_context_and_no_secrets(settings: Settings, client, prefix: str) -> None:
    leaked = {
        "ANTHROPIC_API_KEY": "sk-ant-" + secrets.token_hex(16),
        "GOOGLE_API_KEY": "AIza" + secrets.token_hex(16),
        "AWS_SECRET_ACCESS_KEY": secrets.token_hex(20),
    }
    worker = StepqWorker(
        settings,
        "logs",
        "--pool=threads",
        "--concurrency=2",
        "--loglevel=INFO",
        STEPQ_LOG_JSON="true",
        STEPQ_METRICS_PORT="0",
        **leaked,
    )
    try:
        leaky = client.submit("mt.leaky", prompt="go")
        retried = client.submit("rt.rate_limited", prompt="go")
        assert leaky.wait(timeout=TIMEOUT).status == TurnStatus.COMPLETED
        assert retried.wait(timeout=TIMEOUT).status == TurnStatus.COMPLETED
    finally:
        lines = worker.stop()

    output = "\n".join(lines)
    assert settings.approval_secret is not None
    for secret in [settings.approval_secret.get_secret_value(), *leaked.values()]:
        assert secret not in output
    assert not [line for line in lines if re.match(r"\[\d{4}-\d\d-\d\d", line)]  # no plain-text log lines
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)

    tool_lines = [r for r in records if r["logger"] == "stepq.tools.mt_leak"]
    assert [r["message"].split(" with ")[0] for r in tool_lines] == ["calling upstream for a", "upstream call failed"]
    assert all((r["turn_id"], r["step"], r["attempt"]) == (leaky.turn_id, 0, 0) for r in tool_lines)
    assert "x-api-key: ***" in tool_lines[0]["message"] and "Bearer ***" in tool_lines[0]["message"]
    assert "RuntimeError: upstream refused ***" in tool_lines[1]["exc_info"]

    steps = [(r["step"], r["attempt"]) for r in records if r.get("turn_id") == retried.turn_id]
    assert (0, 0) in steps and (0, 1) in steps  # the retry's log line, then the retried delivery's
    retry_line = next(r for r in records if r.get("turn_id") == retried.turn_id and r["level"] == "WARNING")
    assert retry_line["logger"] == "stepq.worker" and "retry 1" in retry_line["message"]
    assert all({"turn_id", "step", "attempt"} <= r.keys() for r in records if r["logger"] == "stepq.worker")


def test_openai_keys_are_redacted_from_log_lines() -> None:
    from stepq.logging import Redactor, secret_values

    env = {name: f"{name.lower()}-{secrets.token_hex(8)}" for name in (
        "OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN", "STEPQ_OPENAI_COMPATIBLE_API_KEY"
    )}  # fmt: skip
    redact = Redactor(secret_values(environ=env))
    line = redact("retrying with " + ", ".join(env.values()))
    assert not [value for value in env.values() if value in line]


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("calling with Authorization: BEARER sk-live-0123456789", "sk-live-0123456789"),
        ("header X-API-KEY: abcdef0123456789", "abcdef0123456789"),
        ("config {'Session_Token': 'tok0123456789'}", "tok0123456789"),
        ("approval-secret=hunter2hunter2", "hunter2hunter2"),
        ("GET https://generativelanguage.example/v1?alt=sse&KEY=AIzaSy0123456789", "AIzaSy0123456789"),
        ("presigned ?X-Amz-Signature=0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
        ("cannot reach rediss://default:pa55word99@redis.internal:6380/0", "pa55word99"),
    ],
)
def test_each_secret_pattern_is_masked_whatever_its_case(line: str, secret: str) -> None:
    """The redactor's patterns, each in a line of its own: the quick check that skips lines with no trigger word
    (most lines) must let every one of them through to its substitution."""
    from stepq.logging import Redactor

    masked = Redactor(())(line)
    assert secret not in masked and "***" in masked, masked
