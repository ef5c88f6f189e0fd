"""Issue 27 item 6: per-tenant (and per-agent) usage quotas over a window, counted from the usage the trace
reports, checked before every model call: a spent quota stops a running turn (`quota-exceeded` event, the
window and when it resets), refuses a submit (QuotaExceededError; HTTP 429 with Retry-After; CLI exit 2)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from typing import Any

import pytest

from stepq.errors import QuotaExceededError
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, FinishReason, TurnState, TurnStatus
from stepq.store.quotas import usage
from stepq.turns.submit import create_turn
from tests.agents_engine import drive
from tests.conftest import ROOT, make_settings, settings_env
from tests.gateway_support import serve

TENANT = "acme"
HOUR = 3600.0


def _submit(rt: Any, agent: str = "ten.looper", tenant: str = TENANT) -> TurnState:
    state, created = create_turn(rt, agent, prompt="go", metadata={"tenant": tenant})
    assert created
    return state


def _counter(rt: Any, scope: str = "*", window_s: float = HOUR) -> tuple[int, float]:
    index = int(time.time() // window_s)
    return usage(rt.redis.hmget(rt.keys.quota(TENANT, scope, window_s, index), "tokens", "cost"))


def test_usage_is_counted_from_the_trace_per_tenant(rt):
    rt.policies.update(TENANT, "*", {"quota": {"tokens": 10_000_000, "window_s": HOUR}})
    first = drive(rt, _submit(rt).turn_id)
    second = drive(rt, _submit(rt, "ten.small").turn_id)
    other = drive(rt, _submit(rt, tenant="globex").turn_id)  # another tenant: not counted here
    assert TurnStatus.COMPLETED == first.status == second.status == other.status
    traced = sum(s.usage.input_tokens + s.usage.output_tokens for t in (first, second) for s in t.trace.steps)
    assert traced > 0 and _counter(rt) == (traced, 0.0)  # what `stepq show --trace` adds up, no more


def test_a_spent_quota_stops_a_running_turn_before_its_next_model_call(rt):
    rt.policies.update(TENANT, "ten.looper", {"quota": {"tokens": 1, "window_s": HOUR}})  # step 0 spends it
    state = drive(rt, _submit(rt).turn_id)
    assert state.status == TurnStatus.FAILED and state.finish_reason == FinishReason.QUOTA_EXCEEDED
    assert len(state.trace.steps) == 1  # no model call after the quota was spent
    [event] = [e for e in rt.events.read(state.turn_id, 0) if e.type == EventType.QUOTA_EXCEEDED]
    resets_at = (math.floor(time.time() / HOUR) + 1) * HOUR
    assert event.data["scope"] == "ten.looper" and event.data["kind"] == "tokens" and event.data["limit"] == 1
    assert event.data["window_s"] == HOUR and event.data["resets_at"] == resets_at
    assert 0 < event.data["retry_after_s"] <= HOUR
    assert state.error is not None and state.error.startswith(
        "quota-exceeded: tenant acme's quota (ten.looper) allows 1 tokens per 3600s and "
    )
    assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resets_at)) in state.error

    with pytest.raises(QuotaExceededError) as refused:  # and a new turn of that agent is refused at submit
        _submit(rt)
    assert refused.value.resets_at == resets_at and str(refused.value) == event.data["message"].replace(
        f"(in {event.data['retry_after_s']:.0f}s)", f"(in {refused.value.retry_after_s:.0f}s)"
    )
    assert drive(rt, _submit(rt, "ten.small").turn_id).status == TurnStatus.COMPLETED  # a per-agent quota


def test_the_gateway_answers_429_with_retry_after_and_the_cli_exits_2(prefix):
    key = {"sha256": hashlib.sha256(b"k-quota").hexdigest(), "tenant": TENANT, "subject": "bot"}
    settings = make_settings(prefix, api_keys=[key], gateway_rate_limit_rpm=0)
    rt = get_runtime(settings)
    with serve(settings) as gw, gw.client("k-quota") as http:
        rt.policies.update(TENANT, "*", {"quota": {"cost": 0.5, "window_s": HOUR}})
        index = int(time.time() // HOUR)
        for window in (index, index + 1):  # this hour's and the next: the CLI below may run past the hour
            rt.redis.hset(rt.keys.quota(TENANT, "*", HOUR, window), mapping={"tokens": 10, "cost": 0.75})
        answer = http.post("/v1/turns", json={"agent": "ten.small", "prompt": "hi"})
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "quota-exceeded"
        assert "allows 0.5 cost per 3600s and 0.7500 are used" in answer.json()["error"]["message"]
        assert 1 <= int(answer.headers["Retry-After"]) <= HOUR
    done = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "run", "ten.small", "hi", "--metadata", json.dumps({"tenant": TENANT})],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "quota-exceeded: tenant acme's quota (*) allows 0.5 cost" in done.stderr


def test_a_quota_outside_a_tenant_policy_is_refused_not_ignored(rt, prefix):
    from stepq.errors import SubmitError

    with pytest.raises(SubmitError, match=r"^policy.quota counts a tenant's usage"):
        create_turn(rt, "ten.small", prompt="go", policy={"quota": {"tokens": 5}})
    with pytest.raises(ValueError, match=r"a quota belongs in a tenant's policy"):
        make_settings(prefix, policy={"quota": {"tokens": 5}})
