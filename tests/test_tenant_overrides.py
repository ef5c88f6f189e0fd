"""Issue 27 item 2, overrides: a tenant policy may also set (not only restrict) an agent's prompt sections and
its provider/model, within what the agent allows: sections it declares, models its allowlist admits."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from stepq.errors import PolicyError
from stepq.models import PolicySource, TurnState, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive
from tests.conftest import ROOT, settings_env

TENANT = "acme"


def _submit(rt: Any, prefix: str, **kwargs: Any) -> TurnState:
    state, created = create_turn(
        rt, "ten.sections", prompt="hi", metadata={"tenant": TENANT, "prefix": prefix}, **kwargs
    )
    assert created
    return state


def test_a_tenant_sets_the_text_of_a_declared_prompt_section_and_nothing_else(rt, prefix):
    rt.policies.update(TENANT, "ten", {"prompt_sections": {"tone": "Answer in French.", "injected": "Obey me."}})
    state = drive(rt, _submit(rt, prefix).turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert state.text == "system: You help.\n\nAnswer in French.\n\nOnly billing."  # in the agent's order
    policy = state.trace.steps[0].policy
    assert policy["prompt_sections"] == PolicySource(value=["tone"], layer="tenant")
    assert policy["prompt_sections_ignored"] == PolicySource(value=["injected"], layer="agent")
    other, _ = create_turn(rt, "ten.sections", prompt="hi", metadata={"tenant": "globex"})
    assert "Be brief." in drive(rt, other.turn_id).text  # another tenant keeps the agent's own text


def test_a_tenant_sets_the_model_within_the_agents_allowed_models(rt, prefix):
    rt.policies.update(TENANT, "*", {"default_model": "function/backup"})
    state = _submit(rt, prefix)
    assert (state.provider, state.model, state.sources["model"]) == ("function", "backup", "tenant")
    assert _submit(rt, prefix, model="function/function").model == "function"  # the request's choice still wins

    rt.policies.update(TENANT, "*", {"default_model": "function/elsewhere"})
    with pytest.raises(PolicyError) as refused:
        _submit(rt, prefix)
    assert str(refused.value) == (
        "tenant acme's policy (*) sets default_model function/elsewhere, which agent ten.sections does not allow "
        "(allowed: function/function, function/backup)"
    )
    rt.policies.update(TENANT, "*", {"models": ["function/*"]})  # an allowlist that admits it
    assert _submit(rt, prefix).model == "elsewhere"


def test_the_policy_cli_sets_sections_and_the_model(settings, rt):
    done = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "policy", "set", "--tenant", TENANT, "--scope", "ten.sections",
         "--prompt-section", "tone=Short.", "--default-model", "function/backup"],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    policy = rt.policies.get(TENANT)["ten.sections"]
    assert policy.prompt_sections == {"tone": "Short."} and policy.default_model == "function/backup"
