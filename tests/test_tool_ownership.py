"""A tool belongs to the module that declares it: two modules may each declare a `lookup_order`, and each agent
runs its own module's (or the one its module imports), whatever order the modules load in. A name two modules
declare, listed by a module that declares or imports neither, is refused at load in one line naming both.

The modules are tests/extmods/shop_*; the end-to-end case is the agent module of docs/guides/writing-agents.md beside the
bundled demo agents, which declare tools of the same names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stepq.agents.registry import AgentRegistry
from stepq.errors import DefinitionError
from stepq.producer.cli_agents import explain_lines
from tests.conftest import ROOT
from tests.test_cli_errors import embedded_env, run

SHOP_A, SHOP_B = "tests.extmods.shop_a", "tests.extmods.shop_b"
REUSE, VAGUE = "tests.extmods.shop_reuse", "tests.extmods.shop_vague"
GUIDE = ROOT / "docs" / "guides" / "writing-agents.md"
GUIDE_MODULE = "# myagents/support.py\n"


def _loaded(modules: list[str], one_by_one: bool) -> AgentRegistry:
    registry = AgentRegistry()
    for batch in [[m] for m in modules] if one_by_one else [modules]:
        registry.load_modules(batch)
    return registry


def _run_lookup(registry: AgentRegistry, agent_id: str) -> object:
    """What the agent's `shop_lookup` returns when the model calls it (as the engine runs it)."""
    agent = registry.get(agent_id)
    assert agent is not None
    [definition] = [t for t in agent.visible_tools() if t.name == "shop_lookup"]
    return definition.invoke({"order_id": "A-1"}, None)  # type: ignore[arg-type]  # the tool takes no context


@pytest.mark.parametrize("one_by_one", [False, True], ids=["together", "one-by-one"])
@pytest.mark.parametrize("order", [[SHOP_A, SHOP_B], [SHOP_B, SHOP_A]], ids=["a-first", "b-first"])
def test_each_agent_runs_the_tool_its_own_module_declares(order: list[str], one_by_one: bool):
    registry = _loaded([*order, REUSE], one_by_one)
    assert _run_lookup(registry, "shopa.agent") == {"shop": "a", "order_id": "A-1"}
    assert _run_lookup(registry, "shopb.agent") == {"shop": "b", "order_id": "A-1"}
    assert _run_lookup(registry, "shopreuse.agent") == {"shop": "a", "order_id": "A-1"}  # the one it imports
    explanation = registry.explain("shopb.agent")
    assert explanation is not None
    [row] = [line for line in explain_lines(registry, explanation) if line.strip().startswith("shop_lookup")]
    assert row.endswith(f"declared in {SHOP_B}; definition declared in {SHOP_B}"), row


@pytest.mark.parametrize("order", [[SHOP_A, SHOP_B, VAGUE], [VAGUE, SHOP_B, SHOP_A]], ids=["vague-last", "first"])
def test_a_name_two_modules_declare_is_refused_where_it_is_ambiguous(order: list[str]):
    registry = AgentRegistry()
    with pytest.raises(DefinitionError) as refused:
        registry.load_modules(order)
    message = str(refused.value)
    assert "\n" not in message
    assert SHOP_A in message and SHOP_B in message and "shop_lookup" in message and VAGUE in message
    assert registry.get("shopa.agent") is None  # nothing of a refused load is kept


def _guide_module(tmp_path: Path) -> Path:
    """The writing-agents guide's agent module, written where `STEPQ_AGENT_MODULES=myagents.support` finds it."""
    blocks = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), re.DOTALL | re.MULTILINE)
    [code] = [b for b in blocks if b.startswith(GUIDE_MODULE)]
    package = tmp_path / "myagents"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "support.py").write_text(code)
    return tmp_path


@pytest.mark.parametrize(
    "modules",
    ["myagents.support,stepq.agents.demo", "stepq.agents.demo,myagents.support"],
    ids=["mine-first", "demo-first"],
)
def test_the_guide_agent_runs_its_own_tools_beside_the_demo_agents(tmp_path: Path, modules: str):
    folder = _guide_module(tmp_path)
    env = embedded_env(STEPQ_AGENT_MODULES=modules)
    args = ["run", "support.agent", "Refund order_id: A-1", "--provider", "test", "--approve-all", "--json"]
    proc = run(env, *args, cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "completed", result
    assert '"item": "kettle"' in result["text"]  # the guide's orders, not the demo's ("no order A-1")
    assert '"refunded_eur"' in result["text"]  # the guide's Payments ran the refund

    explained = run(env, "agents", "--explain", "support.agent", cwd=folder)
    assert explained.returncode == 0, explained.stderr
    [row] = [line for line in explained.stdout.splitlines() if line.strip().startswith("lookup_order")]
    assert "definition declared in myagents.support" in row, explained.stdout
    demo = run(env, "agents", "--explain", "demo.support", cwd=folder).stdout
    assert "definition declared in stepq.agents.demo" in demo and "myagents" not in demo
