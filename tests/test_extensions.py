"""Overrides and extensions: modules replace, disable and patch each other's agents and tools, with the same
effective agent whatever order they load in; `stepq agents --explain` says where each part came from; workers
run the effective definition.

The modules are tests/extmods: `catalog` declares ext.catalog and ext.retired, `alpha` overrides a tool,
disables ext.retired and extends ext.catalog, `beta` extends ext.catalog where a module-by-module application
would depend on the order, tries to extend the disabled agent and an agent nobody declares."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import textwrap
import uuid

import pytest

from stepq.agents.definition import AgentDefinition
from stepq.agents.extensions import AgentExtension, ModuleExports, Suggestion, resolve
from stepq.agents.registry import AgentRegistry
from stepq.agents.tools import declared_tools, get_tool
from stepq.errors import DefinitionError, UnknownAgentError
from stepq.turns.submit import create_turn
from tests.conftest import WorkerProcess, make_settings, settings_env
from tests.extmods import catalog
from tests.test_cli import stepq, stepq_cmd

CATALOG, ALPHA, BETA = "tests.extmods.catalog", "tests.extmods.alpha", "tests.extmods.beta"
MODULES = [CATALOG, ALPHA, BETA]
EXPECTED_INSTRUCTIONS_START = (
    "You answer catalog questions.\n\nBe brief and cite the product id.\n\nUse ext_stats for catalog metrics."
)


def _loaded(order: list[str], one_by_one: bool = False) -> AgentRegistry:
    registry = AgentRegistry()
    if one_by_one:  # each load recomputes from every module loaded so far
        for name in order:
            registry.load_modules([name])
    else:
        registry.load_modules(order)
    return registry


def _effective(registry: AgentRegistry, agent_id: str) -> dict:
    agent = registry.get(agent_id)
    assert agent is not None
    explanation = registry.explain(agent_id)
    assert explanation is not None
    return {
        "instructions": agent.instructions,
        "allowed_tools": agent.allowed_tools,
        "shown": [t.name for t in agent.visible_tools()],
        "suggestions": [s.model_dump() for s in agent.suggestions],
        "task_plan": agent.task_plan,
        "parts": [p.as_dict() for p in explanation.parts],
    }


# --------------------------------------------------------------------------- order independence


def test_every_load_order_gives_the_same_effective_agent():
    reference = _effective(_loaded(MODULES), "ext.catalog")
    for order in itertools.permutations(MODULES):
        for one_by_one in (False, True):
            assert _effective(_loaded(list(order), one_by_one), "ext.catalog") == reference, (order, one_by_one)

    # and it is the one the patch order (replace, then delete, then append) gives: beta's replaced tool list
    # keeps alpha's appended tool, alpha's suggestion comes before beta's (module names), the legacy section
    # alpha deleted is gone and beta's replaced tone keeps its place
    assert reference["allowed_tools"] == ["ext_lookup", "ext_stats"]
    assert reference["shown"] == ["ext_lookup", "ext_stats", "update_task_plan"]
    assert reference["instructions"].startswith(EXPECTED_INSTRUCTIONS_START)
    assert "ext_old_stats" not in reference["instructions"]
    assert reference["suggestions"] == [
        {"label": "Find a product", "prompt": "Find a product"},
        {"label": "Show catalog stats", "prompt": "Show catalog stats"},
        {"label": "Compare products", "prompt": "Compare products"},
    ]
    assert reference["task_plan"] is True


def test_the_tool_override_runs_the_replacement_under_the_original_name():
    _loaded([BETA, ALPHA, CATALOG])
    lookup = get_tool("ext_lookup")
    assert lookup is not None and lookup.name == "ext_lookup"
    assert lookup.fn.__qualname__ == "ext_fast_lookup"
    declared = declared_tools()["ext_lookup"]["tests.extmods.catalog"]
    assert declared.fn.__qualname__ == "ext_lookup"  # the declaration itself is untouched


def test_provenance_of_each_part():
    parts = {(p.kind, p.name, p.removed): str(p.origin) for p in _loaded(MODULES).explain("ext.catalog").parts}
    assert parts == {
        ("definition", "ext.catalog", False): f"declared in {CATALOG}",
        ("system_prompt", "system_prompt", False): f"declared in {CATALOG}",
        ("section", "tone", False): f"replaced by {BETA} (extension)",
        ("section", "stats", False): f"appended by {ALPHA} (extension)",
        ("section", "legacy", True): f"deleted by {ALPHA} (extension)",
        ("tool", "ext_lookup", False): f"replaced by {BETA} (extension)",
        ("tool", "ext_stats", False): f"appended by {ALPHA} (extension)",
        ("tool", "ext_old_stats", True): f"replaced by {BETA} (extension)",
        ("suggestion", "Find a product", False): f"declared in {CATALOG}",
        ("suggestion", "Old stats", True): f"deleted by {ALPHA} (extension)",
        ("suggestion", "Show catalog stats", False): f"appended by {ALPHA} (extension)",
        ("suggestion", "Compare products", False): f"appended by {BETA} (extension)",
        ("task_plan", "on", False): f"set by {BETA} (extension)",
    }


# --------------------------------------------------------------------------- disabled agents, missing targets


@pytest.mark.parametrize("order", [MODULES, MODULES[::-1]])
def test_a_disabled_agent_is_never_resurrected_by_an_extension(order, caplog):
    with caplog.at_level(logging.WARNING, logger="stepq.agents"):
        registry = _loaded(order)
    assert registry.get("ext.retired") is None
    assert "ext.retired" not in registry.ids()
    assert registry.disabled() == {"ext.retired": ALPHA}
    explanation = registry.explain("ext.retired")
    assert explanation is not None and explanation.agent is None
    assert f"extension in {BETA}: agent 'ext.retired' is disabled by {ALPHA}; skipped" in caplog.messages


def test_submitting_to_a_disabled_agent_is_refused_naming_the_module(prefix):
    from stepq.fleet.runtime import Runtime

    rt = Runtime.build(make_settings(prefix))
    rt.agents = _loaded(MODULES)  # this test's own registry: the process-wide one stays as the other tests left it
    with pytest.raises(UnknownAgentError, match=f"agent 'ext.retired' is disabled by {ALPHA}"):
        create_turn(rt, "ext.retired", prompt="hi")


def test_missing_targets_warn_and_are_skipped(tmp_path, monkeypatch, caplog):
    name = f"ext_tmp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from stepq import AgentExtension
            agent_overrides = {"ext.absent": None}
            tool_overrides = {"ext_absent_tool": None}
            patch = AgentExtension(target="ext.absent_too", append_allowed_tools=["ext_stats"])
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="stepq.agents"):
        registry = _loaded([CATALOG, ALPHA, name])
    assert {
        f"agent_overrides in {name}: no agent 'ext.absent' to replace or disable; skipped",
        f"tool_overrides in {name}: no tool 'ext_absent_tool' to replace or disable; skipped",
        f"extension in {name}: no agent 'ext.absent_too' to extend; skipped",
    } <= set(caplog.messages)
    assert registry.get("ext.absent_too") is None and registry.get("ext.catalog") is not None


def test_deleting_a_part_the_agent_lacks_warns():
    base = AgentDefinition(id="ext.lean", prompt_sections={"a": "A."})
    patch = AgentExtension(target="ext.lean", delete_prompt_sections=["b"], replace_prompt_sections={"c": "C."})
    resolution = resolve([ModuleExports("m1", agents=(base,)), ModuleExports("m2", extensions=(patch,))], {})
    assert resolution.warnings == [
        "extension in m2: agent ext.lean has no prompt section 'c' to replace; skipped",
        "extension in m2: agent ext.lean has no prompt section 'b' to delete; skipped",
    ]
    assert resolution.agents["ext.lean"] is base  # nothing changed: the declared object itself


# --------------------------------------------------------------------------- what no order could settle


def test_two_extensions_replacing_the_same_part_are_refused():
    base = AgentDefinition(id="ext.owned", system_prompt="Base.")
    one = AgentExtension(target="ext.owned", replace_system_prompt="One.")
    two = AgentExtension(target="ext.owned", replace_system_prompt="Two.")
    modules = [ModuleExports("base", agents=(base,)), ModuleExports("m1", extensions=(one,))]
    modules.append(ModuleExports("m2", extensions=(two,)))
    with pytest.raises(DefinitionError, match="extensions in m1 and m2 both set replace_system_prompt"):
        resolve(modules, {})


def test_two_modules_overriding_one_agent_are_refused():
    base = AgentDefinition(id="ext.contested")
    modules = [
        ModuleExports("base", agents=(base,)),
        ModuleExports("m1", agent_overrides={"ext.contested": None}),
        ModuleExports("m2", agent_overrides={"ext.contested": AgentDefinition(id="ext.contested", description="x")}),
    ]
    with pytest.raises(DefinitionError, match="overridden by both m1 and m2"):
        resolve(modules, {})


def test_a_second_declaration_is_refused_and_points_at_agent_overrides():
    modules = [
        ModuleExports("m1", agents=(AgentDefinition(id="ext.twice"),)),
        ModuleExports("m2", agents=(AgentDefinition(id="ext.twice", description="mine"),)),
    ]
    with pytest.raises(
        DefinitionError, match=r"defined twice \(in m1 and m2\); to replace it, put the new one in agent_overrides"
    ):
        resolve(modules, {})


def test_an_override_replaces_the_whole_agent_and_extensions_patch_the_replacement():
    base = AgentDefinition(id="ext.swapped", system_prompt="Old.", prompt_sections={"s": "Old section."})
    new = AgentDefinition(id="ext.swapped", system_prompt="New.", suggestions=[Suggestion(label="Go")])
    patch = AgentExtension(target="ext.swapped", append_prompt_sections={"extra": "Extra."})
    resolution = resolve(
        [
            ModuleExports("a_base", agents=(base,)),
            ModuleExports("b_patch", extensions=(patch,)),
            ModuleExports("c_override", agent_overrides={"ext.swapped": new}),
        ],
        {},
    )
    agent = resolution.agents["ext.swapped"]
    assert agent.instructions == "New.\n\nExtra."
    assert [s.prompt for s in agent.suggestions] == ["Go"]
    origins = {(p.kind, p.name): str(p.origin) for p in resolution.explanations["ext.swapped"].parts}
    assert origins[("definition", "ext.swapped")] == "replaced by c_override (agent_overrides)"
    assert origins[("section", "extra")] == "appended by b_patch (extension)"


def test_a_disabled_tool_leaves_every_agent_that_listed_it():
    tools = {"ext_old_stats": catalog.ext_old_stats}
    agent = AgentDefinition(id="ext.tools", allowed_tools=["ext_old_stats", "ext_stats"])
    resolution = resolve(
        [ModuleExports("m1", agents=(agent,)), ModuleExports("m2", tool_overrides={"ext_old_stats": None})], tools
    )
    assert resolution.agents["ext.tools"].allowed_tools == ["ext_stats"]
    removed = [p for p in resolution.explanations["ext.tools"].parts if p.removed]
    assert [(p.name, str(p.origin)) for p in removed] == [("ext_old_stats", "disabled by m2 (tool_overrides)")]


# --------------------------------------------------------------------------- the CLI


def _agents_cli(prefix: str, modules: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = settings_env(make_settings(prefix, agent_modules=modules))
    return stepq(env, "agents", *args, check=0)


def test_cli_explain_shows_the_effective_definition_and_where_each_part_came_from(prefix):
    proc = _agents_cli(prefix, MODULES, "--explain", "ext.catalog")
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    for expected in [
        "agent ext.catalog",
        f"definition declared in {CATALOG}",
        f"task plan on, set by {BETA} (extension)",
        f"system_prompt declared in {CATALOG}",
        "| You answer catalog questions.",
        f"[tone] replaced by {BETA} (extension)",
        "| Be brief and cite the product id.",
        f"[stats] appended by {ALPHA} (extension)",
        f"- [legacy] deleted by {ALPHA} (extension)",
        f"ext_lookup replaced by {BETA} (extension); definition replaced by {ALPHA} (tool_overrides): "
        f"{ALPHA}.ext_fast_lookup",
        f"ext_stats appended by {ALPHA} (extension); definition declared in {ALPHA}",
        f"- ext_old_stats replaced by {BETA} (extension)",
        f'"Find a product" declared in {CATALOG}',
        f'"Show catalog stats" appended by {ALPHA} (extension)',
        f'"Compare products" appended by {BETA} (extension)',
        f'- "Old stats" deleted by {ALPHA} (extension)',
    ]:
        assert expected in lines, f"{expected!r} not in:\n{proc.stdout}"
    assert "Use ext_old_stats" not in proc.stdout
    # the skipped targets are warned about on stderr, one line each
    assert f"extension in {BETA}: no agent 'ext.nowhere' to extend; skipped" in proc.stderr
    assert f"extension in {BETA}: agent 'ext.retired' is disabled by {ALPHA}; skipped" in proc.stderr
    # the other order prints the very same explanation
    assert _agents_cli(prefix, MODULES[::-1], "--explain", "ext.catalog").stdout == proc.stdout


def test_cli_explain_json_and_the_agent_list(prefix):
    data = json.loads(_agents_cli(prefix, MODULES, "--explain", "ext.catalog", "--json").stdout)
    assert data["definition"]["allowed_tools"] == ["ext_lookup", "ext_stats"]
    assert data["definition"]["prompt_sections"] == {
        "tone": "Be brief and cite the product id.",
        "stats": "Use ext_stats for catalog metrics.",
    }
    lookup = next(p for p in data["parts"] if p["kind"] == "tool" and p["name"] == "ext_lookup")
    assert lookup["tool_definition"] == {"action": "replaced", "module": ALPHA, "via": "tool_overrides"}

    retired = _agents_cli(prefix, MODULES, "--explain", "ext.retired")
    assert f"disabled by {ALPHA} (agent_overrides)" in retired.stdout

    listing = _agents_cli(prefix, MODULES).stdout
    assert "ext.catalog  (chat)  tools: ext_lookup, ext_stats, update_task_plan" in listing
    assert 'suggestion: "Compare products"' in listing
    assert f"ext.retired  disabled by {ALPHA} (agent_overrides)" in listing


def test_cli_explain_of_an_unknown_agent_is_one_line(prefix):
    env = settings_env(make_settings(prefix, agent_modules=MODULES))
    proc = subprocess.run(
        [*stepq_cmd(), "agents", "--explain", "ext.nope"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("stepq: error: unknown agent 'ext.nope'; known agents:")
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- workers


def test_a_worker_runs_the_effective_definition(prefix):
    """A real worker loading the modules in one order runs a turn submitted by a CLI loading them in the other."""
    worker_settings = make_settings(prefix, agent_modules=MODULES[::-1])
    worker = WorkerProcess(worker_settings, "ext")
    try:
        env = settings_env(make_settings(prefix, agent_modules=MODULES))
        proc = stepq(env, "run", "ext.catalog", "find mugs", "--json", check=0)
    finally:
        worker.stop()
    result = json.loads(proc.stdout)
    assert result["status"] == "completed", result
    shown = json.loads(result["text"])
    assert shown["system"].startswith(EXPECTED_INSTRUCTIONS_START)  # the patched prompt, the plan guidance after
    assert "ext_old_stats" not in shown["system"]
    assert shown["tools"] == ["ext_lookup", "ext_stats", "update_task_plan"]
    assert shown["results"] == [{"source": "alpha", "q": "mugs"}]  # the overriding tool ran under the old name
