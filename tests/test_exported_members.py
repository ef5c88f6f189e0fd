"""The public API is exactly the documented list (after httpx's test of the same name).

`stepq.__all__` is sorted, equals the names listed in the "The Python API" section of docs/guides/index.md, and
every name is importable from `stepq` and defined inside the package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest

import stepq
from tests.conftest import ROOT


def documented_names() -> list[str]:
    """The backticked names on the bullet lines of the "## The Python API" section of docs/guides/index.md."""
    text = (ROOT / "docs" / "guides" / "index.md").read_text()
    section = text.split("\n## The Python API\n", 1)[1].split("\n## ", 1)[0]
    bullets = re.findall(r"^- .*?(?=^\S|\Z)", section, re.DOTALL | re.MULTILINE)
    names: list[str] = []
    for bullet in bullets:
        names += re.findall(r"`([A-Za-z_]\w*)`", bullet)
    return names


def test_all_is_sorted_and_unique():
    assert stepq.__all__ == sorted(set(stepq.__all__))


def test_all_equals_the_documented_list():
    documented = documented_names()
    assert sorted(set(documented)) == stepq.__all__


def test_every_public_attribute_is_exported():
    """No public name reachable as `stepq.X` is left out of `__all__` (submodules aside)."""
    public = {
        name
        for name, value in vars(stepq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(stepq.__all__) - {"__version__"}


def test_every_member_is_importable_and_ours():
    for name in stepq.__all__:
        value = getattr(stepq, name)
        if name == "__version__":
            assert isinstance(value, str) and value
            continue
        module = getattr(value, "__module__", "")
        assert module == "stepq" or module.startswith("stepq."), f"{name} comes from {module!r}"


def test_every_exported_error_derives_from_stepq_error():
    errors = [getattr(stepq, n) for n in stepq.__all__ if n.endswith("Error")]
    assert errors and all(issubclass(e, stepq.StepqError) for e in errors)


def test_every_error_a_caller_can_catch_is_exported():
    """Each public class of stepq.errors (the error tree and its code enums) is importable from stepq."""
    from stepq import errors

    public = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and value.__module__ == errors.__name__ and not name.startswith("_")
    }
    assert public <= set(stepq.__all__), sorted(public - set(stepq.__all__))


def test_every_error_class_in_the_package_derives_from_stepq_error():
    """No module defines an exception outside the tree (private helpers, named `_X`, aside)."""
    import importlib
    import pkgutil

    outside = []
    for info in pkgutil.walk_packages(stepq.__path__, "stepq."):
        if info.name.startswith(("stepq.producer.gateway", "stepq.workers")):
            continue  # optional extras and worker wiring: not what a library caller catches
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue  # an adapter whose SDK extra is not installed
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, Exception)
                and value.__module__ == info.name
                and not name.startswith("_")
                and not issubclass(value, stepq.StepqError)
            ):
                outside.append(f"{info.name}.{name}")
    assert not outside, outside


def test_py_typed_ships_with_the_package():
    assert (ROOT / "shared" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    "module",
    [
        "stepq",
        "stepq.errors",
        "stepq.models",
        "stepq.engine.runner",
        "stepq.store.turns",
        "stepq.workers.app",
        "stepq.workers.tasks",
        "stepq.producer.cli",
        "stepq.embedded",
    ],
)
def test_any_module_imports_first_in_a_fresh_interpreter(module: str):
    """`stepq/__init__` imports the client facade: no internal module may trip over that import cycle."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
