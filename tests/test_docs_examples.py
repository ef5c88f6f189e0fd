"""Every example of the README and of every page of docs/ runs as written (the site's examples convention).

A ```python block runs in a fresh interpreter, a ```sh block (also ```bash, ```shell) under
`bash -euo pipefail`, each from an empty temporary folder, in embedded mode (no STEPQ_* variables: the
scripted demo agents and an in-process worker) with the venv's bin first on PATH, so `stepq` is the
installed CLI; it must exit 0 within TIMEOUT seconds and print no traceback, and import only from `stepq`.
Markers on the lines right above a block: `<!-- not-run: <reason> -->` keeps a block that cannot run here
(Kubernetes, Docker, a provider key, a long-lived server) out, with its reason; `<!-- continues -->` runs a
block in the same folder as the page's previous block, after it (one test per such chain).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import ROOT, eventually

TIMEOUT = 120
PYTHON = ("python", "py", "python3")
SHELL = ("sh", "bash", "shell")
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
_COMMENT = re.compile(r"^\s*<!--(.*?)-->\s*$")
_NOT_RUN = re.compile(r"<!--\s*not-run\b\s*:?(.*?)-->", re.DOTALL)
_INTERNAL_IMPORT = re.compile(r"^\s*(?:from|import)\s+(stepq\.[\w.]+)", re.MULTILINE)


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_run: str | None = None  # the reason, when marked; "" when marked without one
    continues: bool = False

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Chain:
    """Blocks that share one folder: a block and the `<!-- continues -->` blocks after it."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.blocks[0].id


def pages() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if "_gen" not in p.relative_to(docs).parts)]


def blocks_of(path: Path) -> list[Block]:
    """The page's python and shell blocks, with the markers on the lines right above each."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for match in _FENCE.finditer(text):
        language = match.group("info").strip().lstrip("{").lstrip(".").split(" ")[0].split("}")[0].lower()
        if language not in PYTHON + SHELL:
            continue
        line = text.count("\n", 0, match.start()) + 1
        indent = len(match.group("indent"))
        code = "".join(
            row[indent:] if row[:indent].strip() == "" else row for row in match.group("body").splitlines(True)
        )
        page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        block = Block(page, line, "python" if language in PYTHON else "sh", code)
        above = line - 2
        while above >= 0 and (comment := _COMMENT.match(lines[above])):
            marker = comment.group(1).strip()
            if marker.startswith("not-run"):
                block.not_run = marker.removeprefix("not-run").lstrip(":").strip()
            elif marker == "continues":
                block.continues = True
            above -= 1
        found.append(block)
    return found


BLOCKS = [block for page in pages() for block in blocks_of(page)]


def chains(blocks: list[Block] | None = None) -> list[Chain]:
    result: list[Chain] = []
    for block in BLOCKS if blocks is None else blocks:
        if block.continues and result and result[-1].blocks[0].page == block.page:
            result[-1].blocks.append(block)
        else:
            result.append(Chain([block]))
    return result


RUNNABLE = [chain for chain in chains() if any(block.not_run is None for block in chain.blocks)]


def example_env() -> dict[str, str]:
    """Embedded mode, the venv's `stepq` and `python` first on PATH; nothing of this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_") and k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_block(block: Block, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run one block in its own session; whatever it leaves running (`stepq worker &`) is killed with it.
    Its output goes to files, not pipes: a background process holding a pipe open would hold us too."""
    command = (
        [sys.executable, "-c", block.code]
        if block.language == "python"
        else ["bash", "-euo", "pipefail", "-c", block.code]
    )
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            command,
            cwd=folder,
            env=example_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            proc.wait()
            pytest.fail(f"{block.id} did not finish within {TIMEOUT} s:\n{_read(out)}\n{_read(err)}")
        finally:
            _kill_session(proc)
        return subprocess.CompletedProcess(command, proc.returncode, _read(out), _read(err))


def _read(file: IO[str]) -> str:
    file.seek(0)
    return file.read()


def _kill_session(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def test_the_pages_have_examples():
    assert sum(block.language == "python" for block in BLOCKS) >= 2  # the client walk-through and an agent, at least


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_block_imports_only_public_names(block: Block):
    internal = _INTERNAL_IMPORT.findall(block.code)
    assert not internal, f"{block.id} imports internal modules {internal}; import from `stepq`"


def test_every_not_run_marker_has_a_reason_and_a_block():
    problems = []
    marked = {(block.page, block.line): block for block in BLOCKS if block.not_run is not None}
    for page in pages():
        text = page.read_text()
        for match in _NOT_RUN.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{page.relative_to(ROOT)}:{line}"
            if not match.group(1).strip():
                problems.append(f"{where}: `<!-- not-run: <reason> -->` needs its reason")
            if not any(p == str(page.relative_to(ROOT)) and line < at <= line + 3 for p, at in marked):
                problems.append(f"{where}: a not-run marker must be right above a python or sh block")
    assert not problems, "\n".join(problems)


def test_every_continues_marker_follows_a_block():
    first_of_page: dict[str, Block] = {}
    for block in BLOCKS:
        first_of_page.setdefault(block.page, block)
    orphans = [block.id for block in first_of_page.values() if block.continues]
    assert not orphans, f"`<!-- continues -->` with no earlier block on the page: {orphans}"


@pytest.mark.parametrize("chain", RUNNABLE, ids=[chain.id for chain in RUNNABLE])
def test_example_runs(chain: Chain, tmp_path: Path):
    for block in chain.blocks:
        if block.not_run is not None:
            continue
        proc = run_block(block, tmp_path)
        output = f"{block.id} ({block.language}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        assert proc.returncode == 0, f"exit code {proc.returncode}: {output}"
        assert "Traceback" not in proc.stdout + proc.stderr, output


def test_client_walkthrough_completes_the_demo_turn(tmp_path: Path):
    """The client walk-through (the block that submits and approves) streams the demo agent's answer,
    approves its refund and ends completed."""
    walkthroughs = [
        b for b in BLOCKS if b.language == "python" and "client.submit(" in b.code and "client.approve(" in b.code
    ]
    assert walkthroughs, "no page has the client walk-through (a python block with client.submit( and client.approve()"
    block = walkthroughs[0]
    proc = run_block(block, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Let me look that order up." in proc.stdout
    assert "the refund is on its way" in proc.stdout  # the step after the approval ran the refund
    assert proc.stdout.strip().splitlines()[-1].startswith("completed stop ")


SAMPLE_PAGE = """# A page

```python
print("one")
```

<!-- not-run: needs a Kubernetes cluster -->
```sh
kubectl get pods
```

- In a list:

    ```sh
    echo hello > greeting.txt
    ```

    <!-- continues -->
    ```bash
    grep -q hello greeting.txt
    ```

```console
$ stepq demo
```
"""


def test_the_markers_are_read(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(SAMPLE_PAGE)
    found = blocks_of(page)
    assert [(b.line, b.language, b.not_run, b.continues) for b in found] == [
        (3, "python", None, False),
        (8, "sh", "needs a Kubernetes cluster", False),
        (14, "sh", None, False),
        (19, "sh", None, True),
    ]
    assert found[2].code == "echo hello > greeting.txt\n"  # the list's indent is not part of the code
    assert [[b.line for b in chain.blocks] for chain in chains(found)] == [[3], [8], [14, 19]]


def test_a_continued_block_runs_in_the_folder_of_the_one_before(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(SAMPLE_PAGE)
    first, then = chains(blocks_of(page))[2].blocks
    folder = tmp_path / "work"
    folder.mkdir()
    assert run_block(first, folder).returncode == 0
    assert run_block(then, folder).returncode == 0
    elsewhere = run_block(then, tmp_path)  # another folder: the file it reads is not there
    assert elsewhere.returncode != 0 and "greeting.txt" in elsewhere.stderr


def test_what_a_block_leaves_running_is_stopped(tmp_path: Path):
    """A block that starts a process in the background (`stepq worker &`) does not leave it behind."""
    block = Block("page.md", 1, "sh", "sleep 300 &\necho $! > background.pid\n")
    assert run_block(block, tmp_path).returncode == 0
    pid = int((tmp_path / "background.pid").read_text())
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # not our child (bash's), so normally ChildProcessError; the kill is what ends it

    def ended() -> bool:  # SIGKILL is delivered asynchronously: a loaded machine may show it running a moment longer
        stat = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
        return stat in ("", "Z")

    eventually(ended, timeout=30, what=f"the block's background process {pid} to end")
