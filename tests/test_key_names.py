"""Every Redis key is spelled in stepq/store/keys.py: no other module builds `f"{prefix}:…"` itself.

One place for key names is what lets a reader list what stepq stores, a test clean up by prefix,
and a turn's keys keep their shared cluster hash tag. The check reads the installed package's source
with `ast` and flags any f-string or `+` that puts a `…prefix…` value right before a ":".
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.test_import_graph import source_modules

KEYS_MODULE = "stepq.store.keys"


def _mentions_prefix(node: ast.expr) -> bool:
    return any(
        (isinstance(n, ast.Name) and "prefix" in n.id.lower()) or (isinstance(n, ast.Attribute) and "prefix" in n.attr)
        for n in ast.walk(node)
    )


def _starts_with_colon(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(":") and not node.value.startswith(": ")  # "x: y" is prose
    if isinstance(node, ast.JoinedStr) and node.values:
        return _starts_with_colon(node.values[0])
    return False


def spelled_keys(source: str) -> list[int]:
    """Lines that build a `<prefix>:…` string outside keys.py."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for here, after in itertools.pairwise(parts):
                if isinstance(here, ast.FormattedValue) and _mentions_prefix(here.value) and _starts_with_colon(after):
                    lines.append(node.lineno)
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and _mentions_prefix(node.left)
            and _starts_with_colon(node.right)
        ):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('k = f"{self.keys.prefix}:rl:{{{scope}}}"', True),
        ('k = f"{prefix}:workers"', True),
        ('k = settings.key_prefix + ":batch:" + batch_id', True),
        ('k = f"{settings.key_prefix}:{queue}"', True),
        ("k = keys.batch(batch_id)", False),
        ('line = f"run {prefix}: {n} items"', False),  # a message, not a key: the colon is not right after
        ('k = f"{turn_id}:{call_id}"', False),
    ],
)
def test_detector(source: str, found: bool) -> None:
    assert bool(spelled_keys(source)) is found


def test_key_names_live_in_keys_py() -> None:
    offenders = [
        f"{name} ({path}:{line})"
        for name, path in source_modules().items()
        if name != KEYS_MODULE
        for line in spelled_keys(Path(path).read_text())
    ]
    assert not offenders, "Redis key names spelled outside stepq/store/keys.py (add a Keys method):\n  " + "\n  ".join(
        offenders
    )
