"""The resolution chain (request > caller > tenant > environment > agent > default), each layer only tightening:
submit-time refusals naming the layer, tenant policies reaching a running turn at its next step (in-process,
and on a real worker process changed through the real `stepq policy` CLI), mutation downgrades, model
allowlists, the kill switch (collapse and refuse), and the trace naming the layer of each effective value."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from typing import Any

import httpx
import pytest

from stepq.engine.runner import StepRunner
from stepq.errors import OverrideError, PolicyError
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, FinishReason, Policy, PolicySource, TurnState, TurnStatus
from stepq.policy.resolution import layers_for, resolve
from stepq.producer.client import Client
from stepq.producer.render import trace_table
from stepq.turns import threads
from stepq.turns.submit import create_turn
from tests.agents_engine import drive, stored_keys
from tests.agents_policy import fleet, gate_key
from tests.conftest import ROOT, WorkerProcess, make_settings, settings_env
from tests.gateway_support import serve

TENANT = "acme"


def _submit(rt: Any, agent: str, prefix: str, tenant: str = TENANT, **kwargs: Any) -> TurnState:
    state, created = create_turn(rt, agent, prompt="go", metadata={"tenant": tenant, "prefix": prefix}, **kwargs)
    assert created
    return state


def _step(rt: Any, turn_id: str, step: int) -> TurnState:
    """Deliver one step in-process (the worker's code path) and return the stored state after it."""
    decision = StepRunner(rt).deliver(turn_id, step)
    state = rt.turns.load(turn_id)
    assert state is not None
    assert decision.action in ("next", "none"), decision
    return state


def _tools(state: TurnState) -> list[list[str] | None]:
    return [s.tools for s in state.trace.steps]


# --------------------------------------------------------------------------- resolving the layers


def test_each_axis_takes_the_tightest_value_and_names_its_layer():
    layers = layers_for(
        "pol.fleet",
        caller=Policy(max_tool_calls=5),
        tenant="acme",
        tenant_doc={"*": Policy(max_steps=4, max_tool_calls=9), "pol": Policy(mutation_policy="read-only")},
        environment={"*": Policy(max_steps=3, max_tokens=1000, max_tool_calls=50)},
    )
    effective = resolve(fleet, fleet.loop.limits(), {"max_steps": "agent", "max_tool_calls": "agent"}, layers)
    assert effective.limits.max_steps == 3 and effective.sources["max_steps"].layer == "environment"
    assert effective.limits.max_tool_calls == 5 and effective.sources["max_tool_calls"].layer == "caller"
    assert effective.limits.max_tokens == 1000 and effective.sources["max_tokens"].layer == "environment"
    assert effective.sources["mutation_policy"] == PolicySource(value="read-only", layer="tenant")
    assert not effective.agent.writes_allowed and fleet.writes_allowed  # the definition itself is untouched
    assert "pol_write" not in [t.name for t in effective.agent.visible_tools()]


def test_a_looser_policy_does_nothing_and_an_equal_one_is_credited_to_the_higher_layer():
    layers = layers_for(
        "pol.fleet",
        tenant="acme",
        tenant_doc={"*": Policy(max_steps=50, mutation_policy="confirm-required", allow_runtime_override=True)},
        environment={"*": Policy(max_steps=8)},
    )
    effective = resolve(fleet, fleet.loop.limits(), {"max_steps": "agent"}, layers)
    assert effective.sources["max_steps"] == PolicySource(value=8, layer="environment")  # equal to the agent's
    assert effective.sources["mutation_policy"] == PolicySource(value="confirm-required", layer="tenant")
    assert effective.agent is fleet  # nothing tightened: no copy


# --------------------------------------------------------------------------- at submit


def test_an_override_that_widens_is_refused_naming_the_binding_layer(rt, prefix):
    rt.policies.update(TENANT, "*", {"max_steps": 3})
    with pytest.raises(OverrideError, match=r"max_steps=5 exceeds the limit of 3 set by tenant acme's policy \(\*\)"):
        _submit(rt, "pol.plain", prefix, loop={"max_steps": 5})
    with pytest.raises(OverrideError, match="exceeds the limit of 2 set by the caller's policy"):
        _submit(rt, "pol.plain", prefix, loop={"max_steps": 3}, policy={"max_steps": 2})
    with pytest.raises(OverrideError, match=r"exceeds the limit of 6 set by agent pol\.plain"):
        _submit(rt, "pol.plain", prefix, tenant="other", loop={"max_steps": 7})
    assert [k for k in stored_keys(prefix) if ":turn:" in k] == []
    state = _submit(rt, "pol.plain", prefix, loop={"max_steps": 2})
    assert state.limits.max_steps == 2 and state.sources["max_steps"] == "request"


def test_the_environment_layer_comes_from_stepq_policy(prefix):
    settings = make_settings(prefix, policy={"max_steps": 4, "models": ["function/*"]})
    rt = get_runtime(settings)
    with pytest.raises(OverrideError, match=r"set by STEPQ_POLICY \(\*\)"):
        _submit(rt, "pol.plain", prefix, loop={"max_steps": 5})
    with pytest.raises(PolicyError, match=r"model scripted/scripted is not allowed by STEPQ_POLICY \(\*\)"):
        _submit(rt, "pol.locked", prefix)
    state = drive(rt, _submit(rt, "pol.plain", prefix).turn_id)
    assert {s.policy["max_steps"].layer for s in state.trace.steps} == {"environment"}


def test_tenant_policies_refuse_models_runtime_overrides_and_killed_agents(rt, prefix):
    rt.policies.update(TENANT, "pol.plain", {"models": ["anthropic/*"]})
    with pytest.raises(PolicyError, match=r"function/function is not allowed by tenant acme's policy \(pol.plain\)"):
        _submit(rt, "pol.plain", prefix)
    rt.policies.update(TENANT, "pol", {"allow_runtime_override": False})
    with pytest.raises(PolicyError, match=r"per-call overrides \(model\): turned off by tenant acme's policy \(pol\)"):
        _submit(rt, "pol.fleet", prefix, model="function/other")
    with pytest.raises(PolicyError, match=r"per-call overrides \(loop\)"):
        _submit(rt, "pol.fleet", prefix, loop={"max_steps": 1})
    rt.policies.update(TENANT, "*", {"kill_switch": "refuse"})
    with pytest.raises(PolicyError, match=r"switched off by tenant acme's policy \(\*\) \(kill switch: refuse\)"):
        _submit(rt, "pol.fleet", prefix)
    assert [k for k in stored_keys(prefix) if ":turn:" in k] == []
    _submit(rt, "pol.fleet", prefix, tenant="other", model="function/other")  # another tenant is untouched


# --------------------------------------------------------------------------- on a running turn (in-process)


def test_a_tenant_policy_change_reaches_a_running_turn_at_its_next_step(rt, prefix):
    turn_id = _submit(rt, "pol.plain", prefix).turn_id
    state = _step(rt, turn_id, 0)
    assert state.trace.steps[0].policy["max_steps"] == PolicySource(value=6, layer="agent")
    assert "pol_write" in (state.trace.steps[0].tools or [])

    rt.policies.update(TENANT, "*", {"max_steps": 2, "mutation_policy": "read-only"})
    state = _step(rt, turn_id, 1)
    assert state.status == TurnStatus.COMPLETED and state.finish_reason == FinishReason.MAX_STEPS
    step = state.trace.steps[1]
    assert step.tools == ["pol_lookup"]  # the write is hidden from this step on
    assert step.policy["max_steps"] == PolicySource(value=2, layer="tenant")
    assert step.policy["mutation_policy"] == PolicySource(value="read-only", layer="tenant")
    assert step.policy["model"] == PolicySource(value="function/function", layer="default")
    assert state.result().trace.summary()["per_step"][1]["policy"]["max_steps"] == "tenant"
    shown = trace_table(state.trace)  # `stepq show --trace`
    assert "↳ policy" not in shown[1]
    second_row = next(i for i, line in enumerate(shown) if line.startswith("1 "))
    assert shown[second_row + 1] == "  ↳ policy: max_steps=2 (tenant), mutation_policy=read-only (tenant)"


def test_kill_switch_collapse_gives_a_running_turn_one_model_call_with_no_tools(rt, prefix):
    turn_id = _submit(rt, "pol.plain", prefix).turn_id
    _step(rt, turn_id, 0)
    rt.policies.update(TENANT, "pol.plain", {"kill_switch": "collapse"})
    state = _step(rt, turn_id, 1)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.text == "no tools on step 1: answering at once"
    assert _tools(state) == [["pol_lookup", "pol_write"], []]
    policy = state.trace.steps[1].policy
    assert policy["kill_switch"] == PolicySource(value="collapse", layer="tenant")
    assert policy["max_steps"] == PolicySource(value=2, layer="tenant")


def test_kill_switch_refuse_fails_a_running_turn_at_its_next_step(rt, prefix):
    turn_id = _submit(rt, "pol.plain", prefix).turn_id
    _step(rt, turn_id, 0)
    rt.policies.update(TENANT, "*", {"kill_switch": "refuse"})
    state = _step(rt, turn_id, 1)
    assert state.status == TurnStatus.FAILED
    assert state.error == "agent pol.plain is switched off by tenant acme's policy (*) (kill switch: refuse)"
    assert len(state.trace.steps) == 1  # no model call after the switch


def test_a_model_dropped_from_the_allowlist_stops_a_running_turn(rt, prefix):
    turn_id = _submit(rt, "pol.plain", prefix).turn_id
    _step(rt, turn_id, 0)
    rt.policies.update(TENANT, "*", {"models": ["anthropic/*", "bedrock"]})
    state = _step(rt, turn_id, 1)
    assert state.status == TurnStatus.FAILED
    assert state.error is not None and "function/function is not allowed by tenant acme's policy (*)" in state.error


def test_clearing_the_policy_lifts_it_for_the_next_step(rt, prefix):
    rt.policies.update(TENANT, "*", {"allowed_tools": ["pol_lookup"]})
    turn_id = _submit(rt, "pol.plain", prefix).turn_id
    state = _step(rt, turn_id, 0)
    assert _tools(state) == [["pol_lookup"]]
    assert state.trace.steps[0].policy["allowed_tools"] == PolicySource(value=["pol_lookup"], layer="tenant")
    rt.policies.clear(TENANT)
    state = _step(rt, turn_id, 1)
    assert _tools(state)[1] == ["pol_lookup", "pol_write"]


# --------------------------------------------------------------------------- a fleet of real worker processes


def _policy_cli(settings: Any, *args: str) -> str:
    """The real `stepq policy` command in its own process, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "policy", *args],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_bad_quota_value_names_the_flag_that_set_it(settings):
    """A quota's fields are nested in the policy: the refusal names --quota-window-s, not a `--quota` there is none of."""
    for flags, said in [
        (["--quota-tokens", "0"], "--quota-tokens: input should be greater than or equal to 1"),
        (
            ["--quota-tokens", "100", "--quota-window-s", "0"],
            "--quota-window-s: input should be greater than or equal to 1",
        ),
        (["--quota-cost", "-1"], "--quota-cost: input should be greater than 0"),
        (["--quota-window-s", "60"], "--quota-tokens/--quota-cost: a quota sets tokens, cost or both"),
        # an infinite one was stored as null, and every later read of the tenant's policy failed
        (["--quota-cost", "inf"], "--quota-cost: input should be a finite number"),
        (["--quota-tokens", "5", "--quota-window-s", "1e309"], "--quota-window-s: input should be a finite number"),
        (["--max-wall-clock-s", "inf"], "--max-wall-clock-s: input should be a finite number"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "stepq.producer.cli", "policy", "set", "--tenant", TENANT, *flags],
            env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert (done.returncode, done.stderr.strip()) == (2, f"stepq: error: {said}"), done.stderr


def test_a_stored_policy_that_no_longer_parses_names_the_command_that_clears_it(settings, rt):
    """An older stepq stored an infinite quota as `null`. Reading it fails with one line, and the command that
    line names works (a scoped clear no longer parses what it removes)."""
    rt.redis.hset(rt.keys.policy(TENANT), "*", '{"quota": {"cost": null, "window_s": null}}')
    rt.redis.sadd(rt.keys.policy_tenants, TENANT)
    done = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "policy", "show"],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = f"stepq: error: tenant {TENANT}'s stored policy (*) is not a valid policy"
    assert done.returncode == 2 and done.stderr.startswith(line) and done.stderr.count("\n") == 1, done.stderr
    assert f"clear it with `stepq policy clear --tenant {TENANT} --scope '*'`" in done.stderr
    assert "a bug in stepq" not in done.stderr
    _policy_cli(settings, "clear", "--tenant", TENANT, "--scope", "*")
    assert rt.redis.hget(rt.keys.policy(TENANT), "*") is None


def _waiting(client: Client, turn_id: str) -> None:
    """Return once the turn's model called pol_wait: the step is provably running and holds in the tool."""
    for event in client.events(turn_id):
        if event.type == EventType.TOOL_CALL and event.data.get("name") == "pol_wait":
            return
    raise AssertionError(f"turn {turn_id} ended before calling pol_wait")


def _release(rt: Any, prefix: str, turn_id: str) -> None:
    rt.redis.rpush(gate_key(prefix, turn_id), "go")


@pytest.fixture
def fleet_worker(settings, tmp_path):
    worker = WorkerProcess(settings, "policy", beat=False, log_path=str(tmp_path / "worker.log"))
    yield worker
    worker.stop()


def test_a_tenant_policy_tightens_a_running_fleet_without_a_restart(settings, rt, prefix, fleet_worker):
    client = Client(settings)
    running = client.submit("pol.fleet", prompt="go", metadata={"tenant": TENANT, "prefix": prefix})
    _waiting(client, running.turn_id)
    out = _policy_cli(settings, "set", "--tenant", TENANT, "--max-steps", "3", "--allowed-tools", "pol_wait,pol_write")
    assert "max_steps=3, allowed_tools=pol_wait,pol_write" in out
    _release(rt, prefix, running.turn_id)
    result = running.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    steps = result.trace.steps
    assert steps[0].tools == ["pol_wait", "pol_lookup", "pol_write"]
    assert steps[0].policy["max_steps"] == PolicySource(value=8, layer="agent")
    assert steps[1].tools == ["pol_wait", "pol_write"], steps[1].policy  # the same turn and worker, the next step
    assert steps[1].policy["max_steps"] == PolicySource(value=3, layer="tenant")
    assert steps[1].policy["allowed_tools"].layer == "tenant"
    assert result.text == "done on step 1"

    # a new turn of the tenant gets the policy from its first step; another tenant's turn never sees it
    fresh = client.submit("pol.fleet", prompt="go", metadata={"tenant": TENANT, "prefix": prefix})
    other = client.submit("pol.fleet", prompt="go", metadata={"tenant": "other", "prefix": prefix})
    for handle in (fresh, other):
        _release(rt, prefix, handle.turn_id)
    assert fresh.wait(timeout=120).trace.steps[0].tools == ["pol_wait", "pol_write"]
    others = other.wait(timeout=120)
    assert others.text == "done on step 3"  # wait, two lookups, the answer
    assert {s.policy["max_steps"].layer for s in others.trace.steps} == {"agent"}


def test_the_kill_switch_reaches_running_turns_on_a_worker_process(settings, rt, prefix, fleet_worker):
    client = Client(settings)
    collapsed = client.submit("pol.fleet", prompt="go", metadata={"tenant": TENANT, "prefix": prefix})
    refused = client.submit("pol.fleet", prompt="go", metadata={"tenant": "beta", "prefix": prefix})
    _waiting(client, collapsed.turn_id)
    _waiting(client, refused.turn_id)
    _policy_cli(settings, "set", "--tenant", TENANT, "--scope", "pol.fleet", "--kill-switch", "collapse")
    _policy_cli(settings, "set", "--tenant", "beta", "--kill-switch", "refuse")
    shown = _policy_cli(settings, "show")
    assert (
        "tenant acme:\n  pol.fleet: kill_switch=collapse" in shown and "tenant beta:\n  *: kill_switch=refuse" in shown
    )
    for handle in (collapsed, refused):
        _release(rt, prefix, handle.turn_id)

    result = collapsed.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "no tools on step 1: answering at once"
    assert [s.tools for s in result.trace.steps] == [["pol_wait", "pol_lookup", "pol_write"], []]
    assert result.trace.steps[1].policy["kill_switch"] == PolicySource(value="collapse", layer="tenant")

    result = refused.wait(timeout=120)
    assert result.status == TurnStatus.FAILED
    assert result.error == "agent pol.fleet is switched off by tenant beta's policy (*) (kill switch: refuse)"
    with pytest.raises(PolicyError, match="kill switch: refuse"):
        client.submit("pol.fleet", prompt="go", metadata={"tenant": "beta", "prefix": prefix})

    _policy_cli(settings, "clear", "--tenant", "beta")
    lifted = client.submit("pol.fleet", prompt="go", metadata={"tenant": "beta", "prefix": prefix})
    _release(rt, prefix, lifted.turn_id)
    assert lifted.wait(timeout=120).text == "done on step 3"


# --------------------------------------------------------------------------- through the gateway


def test_the_gateway_applies_a_keys_policy_and_the_tenants(prefix):
    key = {"sha256": hashlib.sha256(b"k-capped").hexdigest(), "tenant": TENANT, "subject": "bot",
           "policy": {"max_steps": 2, "models": ["function/*"]}}  # fmt: skip
    settings = make_settings(prefix, api_keys=[key], gateway_rate_limit_rpm=0)
    rt = get_runtime(settings)
    with serve(settings) as gw, gw.client("k-capped") as http:

        def post(**body: Any) -> httpx.Response:
            return http.post("/v1/turns", json={"agent": "pol.plain", "prompt": "hi", **body})

        wide = post(loop={"max_steps": 3})
        assert wide.status_code == 400 and wide.json()["error"]["code"] == "override"
        assert "exceeds the limit of 2 set by the caller's policy" in wide.json()["error"]["message"]
        elsewhere = post(model="scripted/scripted")
        assert elsewhere.status_code == 403 and elsewhere.json()["error"]["code"] == "policy"
        assert "not allowed by the caller's policy" in elsewhere.json()["error"]["message"]

        rt.policies.update(TENANT, "pol", {"kill_switch": "refuse"})
        killed = post()
        assert killed.status_code == 403 and "tenant acme's policy (pol)" in killed.json()["error"]["message"]
        rt.policies.clear(TENANT, "pol")

        chosen = post(model="function/other", loop={"max_steps": 1})
        assert chosen.status_code == 201, chosen.text
    state = rt.turns.load(chosen.json()["turn_id"])
    assert state is not None and (state.provider, state.model, state.limits.max_steps) == ("function", "other", 1)
    assert state.caller_policy == Policy(max_steps=2, models=["function/*"])


def test_thread_turns_carry_the_caller_policy_and_answer_to_the_threads_tenant(rt, prefix):
    thread = threads.create_thread(rt, "pol.plain", tenant=TENANT, metadata={"prefix": prefix})
    continued = threads.continue_thread(rt, thread.thread_id, prompt="hi", caller_policy={"max_tool_calls": 1})
    assert continued.state.caller_policy == Policy(max_tool_calls=1)
    assert continued.state.limits.max_tool_calls == 1
    rt.policies.update(TENANT, "*", {"kill_switch": "refuse"})
    with pytest.raises(PolicyError, match="tenant acme's policy"):
        threads.continue_thread(rt, thread.thread_id, prompt="again", multitask="enqueue")
