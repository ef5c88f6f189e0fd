"""Picker and routing metadata (label, keywords, domain, data capabilities) and the models an agent may run, as
`stepq agents` (real CLI, subprocess) and `GET /v1/agents` (real uvicorn gateway) show them; bad metadata is
refused at load in one line."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from pathlib import Path

import pytest

from stepq.agents.definition import AgentDefinition, check_agent
from stepq.errors import DefinitionError
from stepq.models import Policy
from stepq.policy.resolution import Layer, allowed_patterns
from tests.conftest import make_settings, settings_env
from tests.gateway_support import api_keys_setting, serve
from tests.test_cli import stepq

MODULES = ["tests.picker_agents"]
DESK, PLAIN = "picker.refund_desk", "picker.plain_helper"
# the environment's allowlist for the desk: two layers, shown as what both admit
POLICY = {
    "*": {"models": ["anthropic/*", "scripted"]},
    DESK: {"models": ["anthropic/claude-*", "bedrock"]},
}
DESK_FIELDS = {
    "label": "Refund Desk",
    "keywords": ["refunds", "orders"],
    "domain": "billing",
    "data_capabilities": ["orders: read", "refunds: issue"],
}
PLAIN_FIELDS = {"label": "Plain helper", "keywords": [], "domain": None, "data_capabilities": []}


def _listed(data: dict) -> dict[str, dict]:
    return {a["id"]: a for a in data["agents"] if a["id"] in (DESK, PLAIN)}


# --------------------------------------------------------------------------- definitions


def test_metadata_is_optional_and_a_label_is_read_from_the_id():
    agent = AgentDefinition(id="support.refund_desk")
    assert (agent.label, agent.keywords, agent.domain, agent.data_capabilities) == ("Refund desk", [], None, [])
    check_agent(agent)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"label": "Refund\ndesk"}, r"agent shop\.desk: label 'Refund\\ndesk' must be one line$"),
        ({"label": "  "}, r"agent shop\.desk: label is empty$"),
        ({"keywords": ["refunds", ""]}, r"agent shop\.desk: keywords is empty$"),
        ({"keywords": ["x" * 41]}, r"agent shop\.desk: keywords '" + "x" * 40 + r"' is 41 characters; at most 40$"),
        ({"keywords": ["a", "b", "a"]}, r"agent shop\.desk: keywords lists 'a' more than once$"),
        ({"domain": "billing\n"}, r"agent shop\.desk: domain 'billing\\n' must be one line$"),
        ({"data_capabilities": ["orders: read"] * 2}, r"data_capabilities lists 'orders: read' more than once$"),
    ],
)
def test_bad_metadata_is_refused_at_load_naming_the_agent(fields, message):
    with pytest.raises(DefinitionError, match=message):
        check_agent(AgentDefinition(id="shop.desk", **fields))


def test_model_allowlists_of_several_layers_show_as_what_every_one_admits():
    def layer(*patterns: str) -> Layer:
        return Layer("environment", "STEPQ_POLICY", Policy(models=list(patterns)))

    assert allowed_patterns([]) is None
    assert allowed_patterns([Layer("environment", "STEPQ_POLICY", Policy(max_steps=3))]) is None
    assert allowed_patterns([layer("anthropic/*", "scripted"), layer("anthropic/claude-*", "bedrock")]) == [
        "anthropic/claude-*"
    ]
    assert allowed_patterns([layer("*"), layer("bedrock")]) == ["bedrock"]
    assert allowed_patterns([layer("gemini/*"), layer("bedrock")]) == []


# --------------------------------------------------------------------------- the CLI


def test_cli_lists_the_metadata_and_the_allowed_models(prefix):
    env = settings_env(make_settings(prefix, agent_modules=MODULES, policy=POLICY))
    agents = _listed(json.loads(stepq(env, "agents", "--json", check=0).stdout))
    assert {k: agents[DESK][k] for k in DESK_FIELDS} == DESK_FIELDS
    assert agents[DESK]["default_model"] == "anthropic/claude-haiku-4-5"
    assert agents[DESK]["allowed_models"] == ["anthropic/claude-*"]
    assert {k: agents[PLAIN][k] for k in PLAIN_FIELDS} == PLAIN_FIELDS
    assert agents[PLAIN]["allowed_models"] == ["anthropic/*", "scripted"]

    env = settings_env(make_settings(prefix, agent_modules=MODULES))  # no allowlist: the models it runs unasked
    lines = stepq(env, "agents", check=0).stdout.splitlines()
    desk = lines[lines.index(f"{DESK}  (chat)  tools: none") :][:6]
    assert desk[1:] == [
        "  label: Refund Desk  domain: billing",
        "  Refunds damaged orders.",
        "  keywords: refunds, orders",
        "  data: orders: read; refunds: issue",
        "  models: anthropic/claude-haiku-4-5, bedrock/anthropic.claude-3-haiku",
    ]
    plain = lines[lines.index(f"{PLAIN}  (chat)  tools: none") :][:3]
    assert plain[1:] == ["  label: Plain helper", "  models: scripted/scripted"]
    explained = json.loads(stepq(env, "agents", "--explain", DESK, "--json", check=0).stdout)["definition"]
    assert {k: explained[k] for k in DESK_FIELDS} == DESK_FIELDS


def test_cli_refuses_bad_metadata_in_one_line(prefix, tmp_path: Path):
    (tmp_path / "bad_picker_type.py").write_text(
        textwrap.dedent(
            """
            from stepq.agents.definition import AgentDefinition

            agent = AgentDefinition(id="bad.typed", keywords="refunds")
            """
        )
    )
    (tmp_path / "bad_picker_label.py").write_text(
        textwrap.dedent(
            """
            from stepq.agents.definition import AgentDefinition

            agent = AgentDefinition(id="bad.label", label="Refund" + chr(10) + "desk")
            """
        )
    )
    for module, expected in [
        (
            "bad_picker_type",
            "stepq: error: agent module 'bad_picker_type': AgentDefinition keywords: Input should be a valid list",
        ),
        ("bad_picker_label", "stepq: error: agent bad.label: label 'Refund\\ndesk' must be one line"),
    ]:
        env = settings_env(make_settings(prefix, agent_modules=[module]))
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path)])
        proc = stepq(env, "agents", check=2)
        assert proc.stderr.splitlines() == [expected]


# --------------------------------------------------------------------------- the gateway


def test_gateway_lists_the_metadata_and_the_models_under_the_credential_policy(prefix):
    keys = [
        *api_keys_setting(),
        {
            "sha256": hashlib.sha256(b"k-acme-haiku").hexdigest(),
            "tenant": "acme",
            "subject": "picker",
            "scopes": ["read"],
            "policy": {"models": ["anthropic/claude-haiku-*"], "allow_runtime_override": False},
        },
    ]
    settings = make_settings(prefix, agent_modules=MODULES, policy=POLICY, api_keys=keys, gateway_rate_limit_rpm=0)
    with serve(settings) as gw:
        with gw.client() as http:
            agents = _listed(http.get("/v1/agents").json())
        with gw.client("k-acme-haiku") as http:
            narrowed = _listed(http.get("/v1/agents").json())
    assert {k: agents[DESK][k] for k in DESK_FIELDS} == DESK_FIELDS
    assert {k: agents[PLAIN][k] for k in PLAIN_FIELDS} == PLAIN_FIELDS
    assert (agents[DESK]["default_model"], agents[DESK]["allowed_models"]) == (
        "anthropic/claude-haiku-4-5",
        ["anthropic/claude-*"],
    )
    assert (agents[PLAIN]["default_model"], agents[PLAIN]["allowed_models"]) == (
        "scripted/scripted",
        ["anthropic/*", "scripted"],
    )
    assert agents[DESK]["model_choice"] is True
    # the credential's own allowlist (the caller layer) narrows both, and it turns the per-call choice off
    assert narrowed[DESK]["allowed_models"] == narrowed[PLAIN]["allowed_models"] == ["anthropic/claude-haiku-*"]
    assert narrowed[DESK]["model_choice"] is narrowed[PLAIN]["model_choice"] is False
