"""The built wheel as a user installs it: one top-level import name, `stepq`, so a project with its own
`shared/` and `workers/` packages can use it; and no module of the source tree imports under a second name.

The wheel test builds the wheel, creates a fresh virtualenv and installs the wheel with its `embedded`
extra from PyPI (pip's cache makes reruns quicker): minutes on a first run, hence its own timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

INSTALL_TIMEOUT_S = 1500  # building, and downloading celery, redis, pydantic… into an empty venv


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: no STEPQ_* settings, no PYTHONPATH into this repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPQ_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def source_copy(dest: Path) -> Path:
    """The files git would ship (tracked, plus new ones not ignored), copied: a build in the working tree
    would reuse its `build/` directory, where stale files from earlier builds can slip into the wheel."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():  # a file deleted in the working tree but still in the index is skipped
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


USER_SHARED_AGENTS = '''"""The user's own `shared` package: nothing to do with stepq's."""

GREETING = "hello from the user's own shared package"
'''

USER_AGENT_MODULE = """
from shared.agents import GREETING  # the user's package, imported by an agent module the worker loads

from stepq import AgentDefinition, ScriptStep

greeter = AgentDefinition(id="user.greeter", system_prompt="Greet.", script=[ScriptStep(text=GREETING)])
"""

EMBEDDED_TURN = """
import json

import shared.agents
import workers.jobs

from stepq import Client

with Client() as client:  # embedded: no STEPQ_REDIS_URL; the client starts its in-process worker
    greeted = client.wait(client.submit("user.greeter", prompt="hi").turn_id, timeout=120)
    extracted = client.wait(client.submit("demo.extractor", prompt="Ada Lovelace, ada@engines.example").turn_id, timeout=120)

import shared.agents as again  # still the user's, in the same process

print(json.dumps({
    "greeted": [greeted.status, greeted.text],
    "extracted": [extracted.status, extracted.object],
    "shared": [shared.agents.__file__, again.GREETING, workers.jobs.NAME],
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(INSTALL_TIMEOUT_S + 600)
def test_wheel_has_one_top_level_name_and_runs_beside_a_users_own_shared_package(tmp_path):
    wheels = tmp_path / "wheels"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(source_copy(tmp_path / "src")),
        ],
        cwd=tmp_path,
        timeout=INSTALL_TIMEOUT_S,
    )
    (wheel,) = wheels.glob("stepq-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        top_level = {name.split("/", 1)[0] for name in zf.namelist()}
        shipped = set(zf.namelist())
    web = "stepq/producer/web"  # the pages and their vendored libraries: users get them without npm or a CDN
    pages = {f"{web}/index.html", f"{web}/markdown.js", f"{web}/vendor/marked.esm.js", f"{web}/vendor/purify.es.mjs"}
    pages |= {f"{web}/vendor/marked.LICENSE.txt", f"{web}/console/index.html", f"{web}/console/console.js"}
    assert pages <= shipped, sorted(pages - shipped)
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"stepq"}, sorted(top_level)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", f"{wheel}[embedded]"], cwd=tmp_path, timeout=INSTALL_TIMEOUT_S)

    project = tmp_path / "project"  # a user's project with packages named like the repo's folders
    for package, module, body in [
        ("shared", "agents.py", USER_SHARED_AGENTS),
        ("workers", "jobs.py", 'NAME = "the user\'s own workers package"\n'),
    ]:
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("")
        (project / package / module).write_text(body)
    (project / "useragents.py").write_text(USER_AGENT_MODULE)

    env_line = "import os; os.environ['STEPQ_AGENT_MODULES'] = 'useragents'\n"
    proc = run([str(python), "-c", env_line + EMBEDDED_TURN], cwd=project, timeout=300)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["greeted"] == ["completed", "hello from the user's own shared package"]
    assert found["extracted"][0] == "completed" and found["extracted"][1]["email"] == "ada@engines.example"
    assert found["shared"] == [
        str(project / "shared" / "agents.py"),
        "hello from the user's own shared package",
        "the user's own workers package",
    ]

    # the installed CLI, run from the project: its agent module (and through it the user's `shared`) loads
    cli = subprocess.run(
        [str(venv / "bin" / "stepq"), "run", "user.greeter", "hi", "--json"],
        cwd=project,
        env={**clean_env(), "STEPQ_AGENT_MODULES": "useragents"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["text"] == "hello from the user's own shared package"


@pytest.mark.parametrize(
    ("folder", "package"), [("shared", "stepq"), ("workers", "stepq.workers"), ("producer", "stepq.producer")]
)
def test_a_source_folder_does_not_import_under_its_own_name(folder, package):
    """From the repository root the folders are on sys.path, but only their `stepq` names import."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {folder}"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert f"ImportError: import {package}, not {folder}" in proc.stderr
