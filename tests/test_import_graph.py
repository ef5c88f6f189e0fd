"""The package's layering, checked on its import graph.

Every `import` in the installed package's source is read with `ast` (module level, inside
functions, under `if TYPE_CHECKING:`, under `if __name__ == "__main__":`, and
`importlib.import_module("literal")`) and each edge is checked three ways:

- LAYERS, the single source of truth for the layering: every module belongs to one row (a subpackage
  or a root module) and may import only the rows its row lists, in every scope (a lazy or type-only
  import counts as much as a top-level one). The rows form no circle themselves, and each row refuses
  a planted edge. The subpackages' `__init__` docstrings say the same in words.
- No circle among stepq modules over every edge: module level, inside functions (late imports) and
  under TYPE_CHECKING (a type-only circle does not break an import order, but it still ties two modules
  into one that must be read together). `__main__` edges belong to the module run as a script
  (`__main__`), not to the module imported under its name.
- RULES: finer rules about single modules. A rule names who it applies to, what they may not
  import, and the exceptions. A failure names the rule, the module, the edge and the line.

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
    scopes: tuple[str, ...] = ("module", "function", "type-checking", "main")  # where in a module the rule looks
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

# --------------------------------------------------------------------------- the layer table

LEAVES = ("stepq.errors", "stepq.models")  # every library row may import these (models import only errors)
LIBRARY = (
    *LEAVES,
    "stepq.jsonsafe",
    "stepq.cancel",
    "stepq.approvals",
    "stepq.config.*",
    "stepq.logging",
    "stepq.providers.*",
    "stepq.agents.*",
    "stepq.policy.*",
    "stepq.store.*",
    "stepq.fleet.*",
    "stepq.turns.*",
    "stepq.batches.*",
)


@dataclass(frozen=True)
class Layer:
    row: str  # a pattern: a subpackage (`stepq.store.*`) or one root module (`stepq.errors`)
    may_import: tuple[str, ...]  # the rows its modules may import (its own row always)
    why: str
    refuses: tuple[str, str]  # a planted edge the row must refuse (the self-check feeds it in) ...
    permits: tuple[str, str]  # ... and a nearby one it must let through


LAYERS: list[Layer] = [
    Layer(
        "stepq.errors",
        (),
        "the errors import nothing of stepq",
        ("stepq.errors", "stepq.models"),
        ("stepq.errors", "stepq.errors"),
    ),
    Layer(
        "stepq.models",
        ("stepq.errors",),
        "canonical data: nothing above it",
        ("stepq.models", "stepq.config.settings"),
        ("stepq.models", "stepq.errors"),
    ),
    Layer(
        "stepq.jsonsafe",
        LEAVES,
        "a leaf helper",
        ("stepq.jsonsafe", "stepq.store.events"),
        ("stepq.jsonsafe", "stepq.models"),
    ),
    Layer(
        "stepq.cancel",
        LEAVES,
        "a leaf helper",
        ("stepq.cancel", "stepq.agents.tools"),
        ("stepq.cancel", "stepq.errors"),
    ),
    Layer(
        "stepq.io_loop",
        (),
        "the process's provider event loop: a leaf the providers and the emitter share",
        ("stepq.io_loop", "stepq.models"),
        ("stepq.io_loop", "stepq.io_loop"),
    ),
    Layer(
        "stepq.approvals",
        LEAVES,
        "approval tokens: a leaf",
        ("stepq.approvals", "stepq.config.settings"),
        ("stepq.approvals", "stepq.models"),
    ),
    Layer(
        "stepq.config.*",
        LEAVES,
        "configuration is the bottom: nothing of definitions, policy, providers, the store or the fleet",
        ("stepq.config.settings", "stepq.providers.registry"),
        ("stepq.config.settings", "stepq.models"),
    ),
    Layer(
        "stepq.logging",
        (*LEAVES, "stepq.config.*"),
        "logging reads its settings only",
        ("stepq.logging", "stepq.agents.mcp"),
        ("stepq.logging", "stepq.config.settings"),
    ),
    Layer(
        "stepq.providers.*",
        (*LEAVES, "stepq.jsonsafe", "stepq.config.*", "stepq.io_loop"),
        "providers sit below the definitions: they type agents through protocols, never import them",
        ("stepq.providers.registry", "stepq.agents.definition"),
        ("stepq.providers.registry", "stepq.config.module_models"),
    ),
    Layer(
        "stepq.agents.*",
        (*LEAVES, "stepq.jsonsafe", "stepq.cancel", "stepq.config.*", "stepq.logging", "stepq.providers.*"),
        "definitions sit below the engine, the turns and the fleet",
        ("stepq.agents.definition", "stepq.turns.attachments"),
        ("stepq.agents.definition", "stepq.providers.registry"),
    ),
    Layer(
        "stepq.policy.*",
        (*LEAVES, "stepq.config.*", "stepq.agents.*"),
        "policy resolves against definitions, below the engine and the store",
        ("stepq.policy.resolution", "stepq.engine.runner"),
        ("stepq.policy.resolution", "stepq.agents.definition"),
    ),
    Layer(
        "stepq.store.*",
        (*LEAVES, "stepq.jsonsafe", "stepq.cancel", "stepq.config.*"),
        "the store keeps data: it knows no providers, definitions or policy",
        ("stepq.store.turns", "stepq.providers.base"),
        ("stepq.store.turns", "stepq.config.settings"),
    ),
    Layer(
        "stepq.fleet.*",
        (
            *LEAVES,
            "stepq.approvals",
            "stepq.config.*",
            "stepq.logging",
            "stepq.providers.*",
            "stepq.agents.*",
            "stepq.store.*",
        ),
        "the fleet's runtime wires store, limits and agents; it never runs a step or a turn",
        ("stepq.fleet.runtime", "stepq.turns.submit"),
        ("stepq.fleet.runtime", "stepq.store.keys"),
    ),
    Layer(
        "stepq.turns.*",
        (
            *LEAVES,
            "stepq.jsonsafe",
            "stepq.config.*",
            "stepq.providers.*",
            "stepq.agents.*",
            "stepq.policy.*",
            "stepq.store.*",
            "stepq.fleet.*",
        ),
        "turns are submitted and read, never stepped",
        ("stepq.turns.submit", "stepq.engine.runner"),
        ("stepq.turns.submit", "stepq.policy.resolution"),
    ),
    Layer(
        "stepq.batches.*",
        (*LEAVES, "stepq.config.*", "stepq.providers.*", "stepq.store.*", "stepq.fleet.*", "stepq.turns.*"),
        "batches submit turns and park provider calls; the engine steps them",
        ("stepq.batches.driver", "stepq.engine.runner"),
        ("stepq.batches.driver", "stepq.turns.submit"),
    ),
    Layer(
        "stepq.engine.*",
        (*LIBRARY, "stepq.io_loop"),
        "the engine is the library's top",
        ("stepq.engine.runner", "stepq.embedded"),
        ("stepq.engine.runner", "stepq.batches.items"),
    ),
    Layer(
        "stepq.tools",
        ("stepq.agents.*",),
        "the documented `from stepq.tools import tool`",
        ("stepq.tools", "stepq.engine.runner"),
        ("stepq.tools", "stepq.agents.tools"),
    ),
    Layer(
        "stepq.workers.*",
        (*LIBRARY, "stepq.engine.*"),
        "workers run the engine; they never import the producer or the composition module",
        ("stepq.workers.tasks", "stepq.embedded"),
        ("stepq.workers.tasks", "stepq.engine.runner"),
    ),
    Layer(
        "stepq.embedded",
        (*LEAVES, "stepq.config.*", "stepq.fleet.*", "stepq.workers.*"),
        "the one composition module: starts an in-process worker (lazily, see RULES)",
        ("stepq.embedded", "stepq.producer.client"),
        ("stepq.embedded", "stepq.workers.app"),
    ),
    Layer(
        "stepq.producer.*",
        (*LIBRARY, "stepq.engine.*", "stepq.embedded"),
        "the producer sends tasks by name: never worker code",
        ("stepq.producer.cli", "stepq.workers.app"),
        ("stepq.producer.cli", "stepq.embedded"),
    ),
    Layer(
        "stepq",
        (*LIBRARY, "stepq.engine.*", "stepq.embedded", "stepq.producer.*", "stepq.tools"),
        "the facade re-exports; never worker code",
        ("stepq", "stepq.workers.tasks"),
        ("stepq", "stepq.producer.client"),
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


def row_of(module: str) -> Layer | None:
    """The layer a stepq module belongs to: the row with the longest matching pattern."""
    rows = [layer for layer in LAYERS if matches(module, layer.row)]
    return max(rows, key=lambda layer: len(layer.row), default=None)


def owner(target: str, known: set[str]) -> str:
    """The stepq module an import target names (`from stepq.models import X` names stepq.models)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


def layer_violations(edges: list[Edge], known: set[str]) -> list[str]:
    problems = []
    for e in edges:
        target = owner(e.target, known)
        if not target.startswith("stepq") or target == e.importer:
            continue
        src, dst = row_of(e.importer), row_of(target)
        if src is None or dst is None:
            problems.append(f"{e.importer if src is None else target} belongs to no row of LAYERS ({e.where})")
        elif dst is not src and dst.row not in src.may_import:
            problems.append(
                f"{e.importer} imports {target} ({e.scope}-level, {e.where}): row {src.row!r} may import only "
                f"{', '.join(src.may_import) or 'nothing of stepq'} ({src.why})"
            )
    return problems


CIRCLE_SCOPES = ("module", "function", "type-checking")  # every edge but `__main__` blocks (see the docstring)


def circles(edges: list[Edge], known: set[str]) -> list[list[str]]:
    """Every circle (strongly connected component of more than one module) over the edges of CIRCLE_SCOPES."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        target = owner(e.target, known)
        if e.scope in CIRCLE_SCOPES and target.startswith("stepq") and target != e.importer:
            graph.setdefault(e.importer, set()).add(target)
            graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


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


def _is_main(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, source: str, where: str, known: set[str], is_package: bool = False) -> list[Edge]:
    """Every import in one module's source: module level, inside functions and classes, TYPE_CHECKING and
    `__main__` blocks."""
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
            elif isinstance(node, ast.If) and _is_main(node.test) and child in node.body:
                visit(child, "main")
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


@pytest.fixture(scope="module")
def known() -> set[str]:
    return set(source_modules())


def test_layers_hold(graph: list[Edge], known: set[str]) -> None:
    problems = layer_violations(graph, known)
    assert not problems, "imports across layers the table does not allow:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("layer", LAYERS, ids=[layer.row for layer in LAYERS])
def test_each_layer_refuses_its_planted_edge(layer: Layer, known: set[str]) -> None:
    """Each row refuses an edge to a row it does not list (in any scope) and lets a listed one through."""
    importer, target = layer.refuses
    assert row_of(importer) is layer
    for scope in ("module", "function", "type-checking"):
        [message] = layer_violations([Edge(importer, target, "fake.py:1", scope)], known)
        assert f"{importer} imports {target}" in message and layer.row in message
    assert layer_violations([Edge(*layer.permits, "fake.py:1", "module")], known) == []


def test_the_layer_table_has_no_circle() -> None:
    """The rows themselves are ordered: a circle of rows would let a circle of modules through."""
    rows = {layer.row for layer in LAYERS}
    assert all(dep in rows for layer in LAYERS for dep in layer.may_import), "a row lists an unknown row"
    edges = [Edge(layer.row, dep, "table", "module") for layer in LAYERS for dep in layer.may_import]
    assert circles(edges, rows) == []


def test_every_module_has_a_row_and_the_root_stays_small(known: set[str]) -> None:
    """A new module or subpackage joins the table; the package root keeps only its few modules."""
    assert [m for m in sorted(known) if row_of(m) is None] == []
    modules = source_modules()
    root = sorted(m for m in known if m.count(".") == 1 and modules[m].name != "__init__.py")
    assert len(root) + 1 <= 10, f"the package root has {len(root) + 1} modules (with the facade): {root}"


def may_import_sentence(layer: Layer) -> str:
    """The sentence a subpackage's `__init__` docstring states its row with."""
    names = [row.removesuffix(".*") for row in layer.may_import]
    return "May import: " + (", ".join(f"`{n}`" for n in names) or "nothing of stepq") + "."


DOCSTRING_PENDING: tuple[str, ...] = ()  # rows whose __init__ does not state its sentence yet (none)


@pytest.mark.parametrize(
    "layer",
    [layer for layer in LAYERS if layer.row.endswith(".*") and layer.row not in DOCSTRING_PENDING],
    ids=lambda layer: layer.row,
)
def test_subpackage_docstrings_state_their_row(layer: Layer) -> None:
    """The words in each subpackage's `__init__` follow the table, which is the source of truth."""
    package = layer.row.removesuffix(".*")
    docstring = ast.get_docstring(ast.parse(source_modules()[package].read_text())) or ""
    assert may_import_sentence(layer) in " ".join(docstring.split()), (
        f"{package}/__init__.py's docstring should say: {may_import_sentence(layer)}"
    )


def test_no_import_circle(graph: list[Edge], known: set[str]) -> None:
    """No circle among stepq modules, late (function-level) imports included."""
    found = circles(graph, known)
    assert not found, "import circles:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_the_circle_check_fires_on_a_planted_circle(known: set[str]) -> None:
    """A late import closing a loop through three modules is found and named, and so is a type-only one; an
    edge from a `__main__` block is not (it belongs to the script run, not to the module)."""
    planted = [
        Edge("stepq.config.settings", "stepq.policy.resolution", "fake.py:1", "function"),
        Edge("stepq.policy.resolution", "stepq.agents.definition", "fake.py:2", "module"),
        Edge("stepq.agents.definition", "stepq.config.settings", "fake.py:3", "module"),
    ]
    assert circles(planted, known) == [["stepq.agents.definition", "stepq.config.settings", "stepq.policy.resolution"]]
    planted[0] = Edge("stepq.config.settings", "stepq.policy.resolution", "fake.py:1", "type-checking")
    assert circles(planted, known) == [["stepq.agents.definition", "stepq.config.settings", "stepq.policy.resolution"]]
    planted[0] = Edge("stepq.config.settings", "stepq.policy.resolution", "fake.py:1", "main")
    assert circles(planted, known) == []


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

if __name__ == "__main__":
    from stepq.producer.cli import main
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
        ("stepq.producer.cli", "main"),
    } <= edges


def test_graph_covers_the_installed_package(graph: list[Edge]) -> None:
    """The walk found all three folders and real edges (an empty graph would pass every rule)."""
    importers = {e.importer for e in graph}
    assert {"stepq", "stepq.engine.runner", "stepq.store.turns", "stepq.workers.tasks", "stepq.producer.cli"} <= (
        importers
    )
    assert any(e.importer == "stepq.engine.begin" and e.target == "stepq.providers.registry" for e in graph)
    assert any(e.importer == "stepq.workers.tasks" and e.target == "stepq.engine.runner" for e in graph)
