"""Per-tool required features and per-module model defaults (STEPQ_<MODULE>_PROVIDER / _MODEL).

A tool declared with `required_features` is hidden from the model of a turn whose caller lacks them, and a
call to it (a model that names it anyway) is not run. Module defaults come between a caller's choice and the
agent's own default, are read when a process starts, and a bad one stops it with one line naming the variable.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from stepq.config.module_models import ModuleModel
from stepq.config.settings import load_settings
from stepq.errors import ConfigurationError, SubmitError
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, TurnStatus
from stepq.turns.submit import new_turn_state
from tests.conftest import ROOT, make_settings, settings_env


def _run(client, features):
    handle = client.submit("feat.orders", prompt="go", features=features)
    result = handle.wait(timeout=60)
    return result, list(handle.events())


def test_a_caller_without_the_feature_never_sees_the_tool(worker, client):
    result, events = _run(client, ["crm.other"])
    assert result.status == TurnStatus.COMPLETED
    start = next(e for e in events if e.type == EventType.STEP_START)
    assert start.data["tools"] == ["feat_echo"]
    assert client.get(result.turn_id).features == ["crm.other"]
    # the scripted model calls it anyway: not found, never run
    [tool_result] = [e for e in events if e.type == EventType.TOOL_RESULT]
    assert tool_result.data["status"] == "not_found" and tool_result.data["is_error"] is True


def test_a_caller_with_the_feature_sees_and_runs_it(worker, client):
    result, events = _run(client, ["orders.view"])
    assert result.status == TurnStatus.COMPLETED
    start = next(e for e in events if e.type == EventType.STEP_START)
    assert start.data["tools"] == ["feat_orders", "feat_echo"]  # the MCP tool needs crm.view as well
    [tool_result] = [e for e in events if e.type == EventType.TOOL_RESULT]
    assert tool_result.data["output"] == {"order_id": "A-7", "status": "shipped"}


def test_an_mcp_tool_can_require_features_too(rt):
    agent = rt.agents.get("feat.orders")
    assert [t.name for t in agent.visible_tools(["orders.view", "crm.view"])] == [
        "feat_orders",
        "feat_echo",
        "crm_lookup",
    ]
    assert [t.name for t in agent.visible_tools([])] == ["feat_echo"]
    assert len(agent.visible_tools()) == 3  # no caller named: a definition check sees every tool


def test_features_must_be_a_list_of_names(rt):
    with pytest.raises(SubmitError, match="features must be a list of feature names"):
        new_turn_state(rt, "feat.orders", prompt="go", features="orders.view")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- per-module model defaults


def test_a_module_default_beats_the_agent_default(prefix):
    # feat.orders runs on `scripted` (it has a script); its module's variable picks the model
    settings = make_settings(prefix, module_models={"feat": ModuleModel(model="scripted/m-env")})
    rt = get_runtime(settings)
    _, state = new_turn_state(rt, "feat.orders", prompt="go")
    assert (state.provider, state.model) == ("scripted", "m-env")
    _, other = new_turn_state(rt, "mcp.reader", prompt="go")  # another module: untouched
    assert (other.provider, other.model) == ("scripted", "scripted")


def test_a_module_provider_is_paired_with_its_own_model(prefix):
    settings = make_settings(prefix, module_models={"feat": ModuleModel(provider="test")}, model="fleet-model")
    _, state = new_turn_state(get_runtime(settings), "feat.orders", prompt="go")
    assert (state.provider, state.model) == ("test", "test")  # not STEPQ_MODEL's id, meant for another provider


def test_a_turn_on_the_module_provider_runs_on_a_worker(worker, prefix, settings, monkeypatch):
    monkeypatch.setenv("STEPQ_FEAT_PROVIDER", "test")
    loaded = load_settings()
    assert loaded.module_models == {"feat": ModuleModel(provider="test")}
    assert loaded.to_env()["STEPQ_FEAT_PROVIDER"] == "test"
    from stepq.producer.client import Client

    client = Client(settings.model_copy(update={"module_models": loaded.module_models}))
    handle = client.submit("feat.orders", prompt="go", features=["orders.view"])
    result = handle.wait(timeout=60)
    assert result.status == TurnStatus.COMPLETED
    state = client.get(handle.turn_id)
    assert (state.provider, state.model) == ("test", "test")
    assert result.trace.steps[0].provider == "test"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"STEPQ_FEAT_PROVIDER": "nope"}, "STEPQ_FEAT_PROVIDER: unknown provider 'nope'"),
        ({"STEPQ_FEAT_MODEL": "nope/x"}, None),  # not a provider prefix: a model id with a slash
        ({"STEPQ_FEAT_PROVIDER": "gemini"}, "STEPQ_FEAT_PROVIDER=gemini needs STEPQ_FEAT_MODEL too"),
    ],
)
def test_bad_module_variables_stop_a_process_in_one_line(monkeypatch, variables, message):
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    if message is None:
        assert load_settings().module_models["feat"].model == "nope/x"
        return
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value).startswith(message)


def test_the_cli_names_the_bad_module_variable(settings):
    env = settings_env(settings) | {"STEPQ_FEAT_PROVIDER": "nope"}
    proc = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "status"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()  # one line, no traceback
    assert "STEPQ_FEAT_PROVIDER: unknown provider 'nope'" in line
