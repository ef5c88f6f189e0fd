"""Issue 27 item 11: stop conditions and tool choice tightened by the tenant and environment layers like the
other fields, and budget presets by name (`small`, `standard`, `long`, STEPQ_BUDGET_PRESETS) in an agent, a
submit's loop overrides and a policy."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from stepq.errors import OverrideError
from stepq.fleet.runtime import get_runtime
from stepq.models import DEFAULT_BUDGET_PRESETS, FinishReason, LoopStop, Policy, PolicySource, TurnState, TurnStatus
from stepq.policy.resolution import layers_for, resolve
from stepq.turns.submit import create_turn
from tests.agents_engine import drive
from tests.agents_tenancy import looper, small
from tests.conftest import ROOT, make_settings, settings_env

TENANT = "acme"


def _submit(rt: Any, agent: str, prefix: str, **kwargs: Any) -> TurnState:
    state, created = create_turn(rt, agent, prompt="go", metadata={"tenant": TENANT, "prefix": prefix}, **kwargs)
    assert created
    return state


# --------------------------------------------------------------------------- stop conditions


def test_a_tenant_stop_condition_ends_a_running_turn_sooner(rt, prefix):
    rt.policies.update(TENANT, "ten", {"stop_when": [{"step_count": 2}]})
    state = drive(rt, _submit(rt, "ten.looper", prefix).turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.stopped_by == LoopStop.STEP_COUNT and len(state.trace.steps) == 2  # of the agent's 8
    assert state.trace.steps[0].policy["stop_when"] == PolicySource(value=[{"step_count": 2}], layer="tenant")


def test_the_environment_layer_adds_a_has_tool_call_stop(prefix):
    rt = get_runtime(make_settings(prefix, policy={"stop_when": [{"has_tool_call": "ten_hand_over"}]}))
    state = drive(rt, _submit(rt, "ten.looper", prefix, loop={"tool_choice": "ten_hand_over"}).turn_id)
    assert state.stopped_by == LoopStop.HAS_TOOL_CALL, state.error
    assert state.trace.steps[0].tool_calls == ["ten_hand_over"]


def test_a_looser_stop_does_nothing_and_the_tightest_step_count_wins():
    layers = layers_for(
        "ten.looper",
        tenant=TENANT,
        tenant_doc={"*": Policy(stop_when=[{"step_count": 5}])},  # type: ignore[list-item]
        environment={"*": Policy(stop_when=[{"step_count": 3}, {"custom": "ten.never"}])},  # type: ignore[list-item]
    )
    base = looper.loop.limits().model_copy(update={"stop_after_steps": 4})
    effective = resolve(looper, base, {}, layers)
    assert effective.limits.stop_after_steps == 3
    assert effective.limits.stop_custom == ["ten.never"]
    assert effective.sources["stop_when"].layer == "tenant"  # the highest layer that added one


# --------------------------------------------------------------------------- tool choice


def test_a_tenant_tool_choice_tightens_every_step_and_prepare_step_cannot_loosen_it(rt, prefix):
    rt.policies.update(TENANT, "ten.looper", {"tool_choice": "none"})
    state = drive(rt, _submit(rt, "ten.looper", prefix).turn_id)
    assert state.status == TurnStatus.COMPLETED and state.finish_reason == FinishReason.STOP, state.error
    assert state.text == "answered on step 0 (tool_choice none)"
    assert state.trace.steps[0].policy["tool_choice"] == PolicySource(value="none", layer="tenant")


def test_tool_choice_only_tightens_and_names_its_layer():
    def effective(tenant: str | None, environment: str | None, own: str | None = None) -> Any:
        layers = layers_for(
            "ten.looper",
            tenant=TENANT,
            tenant_doc={"*": Policy(tool_choice=tenant)},
            environment={"*": Policy(tool_choice=environment)},
        )
        return resolve(looper.model_copy(update={"tool_choice": own}), looper.loop.limits(), {}, layers)

    tight = effective("ten_lookup", "required")
    assert tight.limits.tool_choice == "ten_lookup" and tight.sources["tool_choice"].layer == "tenant"
    loose = effective("auto", None, own="required")  # auto is looser than the agent's required: nothing changes
    assert loose.limits.tool_choice is None and "tool_choice" not in loose.sources
    env = effective(None, "required")
    assert env.limits.tool_choice == "required" and env.sources["tool_choice"].layer == "environment"
    crossed = effective("none", None, own="required")  # neither contains the other: the policy binds
    assert crossed.limits.tool_choice == "none"


# --------------------------------------------------------------------------- budget presets


def test_an_agent_defines_its_budget_by_preset_name():
    assert small.loop.budget == DEFAULT_BUDGET_PRESETS["small"]
    assert small.loop.limits().max_tool_calls == 5


def test_a_submit_names_a_preset_from_this_processs_settings(prefix):
    rt = get_runtime(make_settings(prefix, budget_presets={"tiny": {"max_tool_calls": 1, "max_tokens": 50}}))
    state = _submit(rt, "ten.looper", prefix, loop={"budget": "tiny"})
    assert (state.limits.max_tool_calls, state.limits.max_tokens) == (1, 50)
    assert state.sources["max_tool_calls"] == "request"
    assert _submit(rt, "ten.looper", prefix, loop={"budget": "small"}).limits.max_tool_calls == 5  # defaults stay
    with pytest.raises(OverrideError, match=r"^loop.budget: unknown budget preset 'huge'; known: long, small, "):
        _submit(rt, "ten.looper", prefix, loop={"budget": "huge"})
    with pytest.raises(OverrideError, match=r"budget.max_tool_calls=25 exceeds the limit of 5 set by agent ten.small"):
        _submit(rt, "ten.small", prefix, loop={"budget": "standard"})  # a preset tightens like any budget


def test_a_tenant_policy_names_a_preset_and_its_own_caps_win(rt, prefix):
    rt.policies.update(TENANT, "*", {"budget": "small", "max_tokens": 900})
    state = drive(rt, _submit(rt, "ten.looper", prefix).turn_id)
    policy = state.trace.steps[0].policy
    assert policy["max_tool_calls"] == PolicySource(value=5, layer="tenant")
    assert policy["max_tokens"] == PolicySource(value=900, layer="tenant")
    assert state.stopped_by == LoopStop.TOOL_CALL_BUDGET, state.error


def test_a_preset_unknown_to_the_worker_fails_the_turn_closed(rt, prefix):
    turn_id = _submit(rt, "ten.looper", prefix).turn_id
    rt.policies.update(TENANT, "*", {"budget": "nightly"})  # written by a process whose presets have it
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.FAILED
    assert state.error is not None and "tenant acme's policy (*): unknown budget preset 'nightly'" in state.error


def _policy_cli(settings: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "policy", *args],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_policy_cli_sets_stops_tool_choice_and_a_preset(settings, rt):
    done = _policy_cli(
        settings, "set", "--tenant", TENANT, "--stop-when", '{"step_count": 2}', "--tool-choice", "required",
        "--budget", "long",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert rt.policies.get(TENANT)["*"] == Policy(stop_when=[{"step_count": 2}], tool_choice="required", budget="long")  # type: ignore[list-item]
    refused = _policy_cli(settings, "set", "--tenant", TENANT, "--budget", "huge")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--budget: unknown budget preset 'huge'" in refused.stderr
    bad = _policy_cli(settings, "set", "--tenant", TENANT, "--stop-when", '{"step_count": 1, "custom": "a.b"}')
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "exactly one of" in bad.stderr, bad.stderr
