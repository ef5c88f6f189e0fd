"""The package's layering, checked on its import graph.

Every `import` in the installed package's source is read with `ast` (module level, inside
functions, under `if TYPE_CHECKING:`, and `importlib.import_module("literal")`) and each edge
is checked against RULES below. A rule names who it applies to, what they may not import, and
the exceptions. A failure names the rule, the module, the edge and the line.

The folders map into the one import name: shared/ is `stepq`, workers/ is `stepq.workers`,
producer/ is `stepq.producer`; the roots are found from the installed package, not from the repo.

Patterns: `stepq.store.*` is the package and everything under it; a name without `.*` is that
one module only (so `stepq` alone is the facade, `stepq/__init__.py`).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    importers: tuple[str, ...]  # the modules this rule constrains
    forbidden: tuple[str, ...]  # what they may not import ...
    allowed: tuple[str, ...] = ()  # ... except these
    exempt: tuple[str, ...] = ()  # importers the rule does not constrain
    scopes: tuple[str, ...] = ("module", "function", "type-checking")  # where in a module the rule looks
    violation: tuple[str, str] = ("", "")  # an edge the rule must refuse (the self-check feeds it in) ...
    violation_scope: str = "function"  # ... from this scope: a lazy import counts as much as a top-level one
    permitted: tuple[str, str] | None = None  # a nearby edge the rule must let through
    permitted_scope: str = "module"


RULES: list[Rule] = [
    Rule(
        "models-at-the-bottom",
        "models are the bottom layer: they import nothing else of stepq but the errors",
        importers=("stepq.models",),
        forbidden=("stepq.*",),
        allowed=("stepq.errors",),
        violation=("stepq.models", "stepq.providers.base"),
        permitted=("stepq.models", "stepq.errors"),
    ),
    Rule(
        "store",
        "the store never imports providers, the engine, definitions, the producer or workers",
        importers=("stepq.store.*",),
        forbidden=(
            "stepq.providers.*",
            "stepq.engine.*",
            "stepq.agents.definition",
            "stepq.agents.tools",
            "stepq.producer.*",
            "stepq.workers.*",
        ),
        violation=("stepq.store.turns", "stepq.providers.base"),
        permitted=("stepq.store.turns", "stepq.models"),
    ),
    Rule(
        "providers",
        "providers never import the engine, the store, the producer or workers",
        importers=("stepq.providers.*",),
        forbidden=("stepq.engine.*", "stepq.store.*", "stepq.producer.*", "stepq.workers.*"),
        violation=("stepq.providers.anthropic.adapter", "stepq.engine.runner"),
        permitted=("stepq.providers.anthropic.adapter", "stepq.providers.base"),
    ),
    Rule(
        "engine-adapters",
        "the engine uses the provider interface and registry, never a concrete adapter",
        importers=("stepq.engine.*",),
        forbidden=("stepq.providers.*",),
        allowed=("stepq.providers.base", "stepq.providers.registry"),
        violation=("stepq.engine.runner", "stepq.providers.anthropic.adapter"),
        permitted=("stepq.engine.runner", "stepq.providers.registry"),
    ),
    Rule(
        "definitions",
        "definitions (agents, tools) never import the engine",
        importers=("stepq.agents.definition", "stepq.agents.tools"),
        forbidden=("stepq.engine.*",),
        violation=("stepq.agents.definition", "stepq.engine.structured"),
        permitted=("stepq.agents.definition", "stepq.providers.registry"),
    ),
    Rule(
        "library-no-celery",
        "the library never imports Celery, the workers or the producer "
        "(only the facade and stepq.embedded, the one composition module)",
        importers=("stepq.*",),
        exempt=("stepq", "stepq.embedded", "stepq.workers.*", "stepq.producer.*"),
        forbidden=("celery.*", "stepq.workers.*", "stepq.producer.*"),
        violation=("stepq.fleet.runtime", "celery.app"),
        permitted=("stepq.embedded", "stepq.workers.app"),
    ),
    Rule(
        "facade",
        "the facade (stepq/__init__.py) re-exports the producer's Client, never worker code or Celery",
        importers=("stepq",),
        forbidden=("celery.*", "stepq.workers.*"),
        violation=("stepq", "stepq.workers.tasks"),
        permitted=("stepq", "stepq.producer.client"),
    ),
    Rule(
        "embedded-lazy",
        "stepq.embedded imports worker code only lazily, inside the function that starts the in-process worker",
        importers=("stepq.embedded",),
        forbidden=("stepq.workers.*",),
        scopes=("module",),
        violation=("stepq.embedded", "stepq.workers.app"),
        violation_scope="module",
        permitted=("stepq.embedded", "stepq.workers.app"),
        permitted_scope="function",
    ),
    Rule(
        "producer-no-workers",
        "the producer never imports worker code (it sends tasks by name)",
        importers=("stepq.producer.*",),
        forbidden=("stepq.workers.*",),
        violation=("stepq.producer.cli", "stepq.workers.app"),
        permitted=("stepq.producer.cli", "stepq.embedded"),
    ),
    Rule(
        "workers-no-producer",
        "workers never import the producer",
        importers=("stepq.workers.*",),
        forbidden=("stepq.producer.*",),
        violation=("stepq.workers.tasks", "stepq.producer.client"),
        permitted=("stepq.workers.tasks", "stepq.engine.runner"),
    ),
]

ROOTS = ("stepq", "stepq.workers", "stepq.producer")  # where each folder is mapped in the installed package


@dataclass(frozen=True)
class Edge:
    importer: str
    target: str
    where: str  # path:line
    scope: str  # "module", "function" or "type-checking"


# --------------------------------------------------------------------------- the checker


def matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        base = pattern[:-2]
        return module == base or module.startswith(base + ".")
    return module == pattern


def broken(rule: Rule, edge: Edge) -> bool:
    if edge.scope not in rule.scopes:
        return False
    if not any(matches(edge.importer, p) for p in rule.importers):
        return False
    if any(matches(edge.importer, p) for p in rule.exempt):
        return False
    if edge.target == edge.importer:
        return False
    if not any(matches(edge.target, p) for p in rule.forbidden):
        return False
    return not any(matches(edge.target, p) for p in rule.allowed)


def violations(rule: Rule, edges: list[Edge]) -> list[str]:
    return [
        f"{e.importer} imports {e.target} ({e.scope}-level, {e.where}): breaks rule {rule.id!r}: {rule.name}"
        for e in edges
        if broken(rule, e)
    ]


# --------------------------------------------------------------------------- the graph


def source_modules() -> dict[str, Path]:
    """Module name -> source file for every module of the installed package, via each root's folder."""
    modules: dict[str, Path] = {}
    for root in ROOTS:
        spec = importlib.util.find_spec(root)
        assert spec is not None and spec.submodule_search_locations, f"{root} is not installed as a package"
        for folder in map(Path, spec.submodule_search_locations):
            for path in sorted(folder.rglob("*.py")):
                parts = path.relative_to(folder).with_suffix("").parts
                if "__pycache__" in parts:
                    continue
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules.setdefault(".".join((root, *parts)), path)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, source: str, where: str, known: set[str], is_package: bool = False) -> list[Edge]:
    """Every import in one module's source: module level, inside functions and classes, TYPE_CHECKING blocks."""
    edges: list[Edge] = []
    package = module if is_package else module.rpartition(".")[0]

    def add(target: str, node: ast.AST, scope: str) -> None:
        edges.append(Edge(module, target, f"{where}:{getattr(node, 'lineno', 0)}", scope))

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, scope)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node, scope)
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in {"import_module", "__import__"})
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node, scope)
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                visit(child, "type-checking")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function")
            else:
                visit(child, scope)

    visit(ast.parse(source), "module")
    return edges


def import_graph() -> list[Edge]:
    modules = source_modules()
    known = set(modules)
    edges: list[Edge] = []
    for name, path in modules.items():
        edges += imports_of(name, path.read_text(), str(path), known, is_package=path.name == "__init__.py")
    return edges


@pytest.fixture(scope="module")
def graph() -> list[Edge]:
    return import_graph()


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_holds(rule: Rule, graph: list[Edge]) -> None:
    problems = violations(rule, graph)
    assert not problems, "forbidden imports:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_fires_on_a_forbidden_edge(rule: Rule) -> None:
    """Each rule refuses its example edge (and lets its nearby permitted edge through): no rule is dead."""
    importer, target = rule.violation
    fake = Edge(importer, target, "fake.py:1", rule.violation_scope)
    [message] = violations(rule, [fake])
    assert f"{importer} imports {target}" in message and rule.name in message
    if rule.permitted is not None:
        assert violations(rule, [Edge(*rule.permitted, "fake.py:1", rule.permitted_scope)]) == []


def test_walker_sees_every_kind_of_import() -> None:
    source = """
from __future__ import annotations
import json
from typing import TYPE_CHECKING
from . import keys
from ..engine import runner
if TYPE_CHECKING:
    from stepq.providers.base import ProviderAdapter

def later():
    from stepq.workers.app import create_app
    import importlib
    importlib.import_module("stepq.producer.cli")

class Lazy:
    def method(self):
        import celery
"""
    known = {"stepq.store.keys", "stepq.engine.runner"}
    edges = {(e.target, e.scope) for e in imports_of("stepq.store.turns", source, "x.py", known)}
    assert {
        ("json", "module"),
        ("stepq.store.keys", "module"),
        ("stepq.engine.runner", "module"),
        ("stepq.providers.base", "type-checking"),
        ("stepq.workers.app", "function"),
        ("stepq.producer.cli", "function"),
        ("celery", "function"),
    } <= edges


def test_graph_covers_the_installed_package(graph: list[Edge]) -> None:
    """The walk found all three folders and real edges (an empty graph would pass every rule)."""
    importers = {e.importer for e in graph}
    assert {"stepq", "stepq.engine.runner", "stepq.store.turns", "stepq.workers.tasks", "stepq.producer.cli"} <= (
        importers
    )
    assert any(e.importer == "stepq.engine.runner" and e.target == "stepq.providers.registry" for e in graph)
    assert any(e.importer == "stepq.workers.tasks" and e.target == "stepq.engine.runner" for e in graph)
