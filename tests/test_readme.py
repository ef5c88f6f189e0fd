"""Every ```python block of README.md runs as written: each in a fresh interpreter, embedded mode
(no STEPQ_* variables, so the scripted demo agents and an in-process worker), from an empty folder,
so a block can use only what it imports itself, and only from `stepq`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

TIMEOUT = 120
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][\w.]*)", re.MULTILINE)


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of the README."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


BLOCKS = python_blocks()


def test_readme_has_python_blocks():
    assert BLOCKS  # the quickstart: the client walk-through (the agent module moved to docs/guides/writing-agents.md)


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_block_imports_only_public_names(line: int, code: str):
    internal = [m for m in _IMPORT.findall(code) if m.startswith("stepq.")]
    assert not internal, f"README.md:{line} imports internal modules {internal}; import from `stepq`"


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_block_runs(line: int, code: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["PYTHONPATH"] = str(ROOT)  # the package only: the README's own folders are not importable
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"README.md:{line} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, f"README.md:{line}:\n{proc.stderr}"


def test_client_walkthrough_completes_the_demo_turn(tmp_path: Path):
    """The "From Python" block streams the demo agent's answer, approves its refund and ends completed."""
    code = next(code for _, code in BLOCKS if "client.submit(" in code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    assert "Let me look that order up." in proc.stdout
    assert "the refund is on its way" in proc.stdout  # the step after the approval ran the refund
    assert proc.stdout.strip().splitlines()[-1].startswith("completed stop ")
