"""The documentation site builds strictly (`mkdocs build --strict`, as `make docs` does): a broken link or
anchor, a page left out of the nav, a docstring mkdocstrings cannot render or any other warning fails it.
The generated Reference pages hold what the code holds, and their guards (every exported name has an entry,
every event type a section) stop the build when a page falls behind the code."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mkdocs.exceptions import PluginError

import stepq
from stepq.config.settings import Settings
from tests.conftest import ROOT

GEN = ROOT / "docs" / "_gen"
BUILD_TIMEOUT = 240


def _hooks() -> ModuleType:
    sys.path.insert(0, str(GEN))
    import hooks

    return hooks


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module's tests into a temporary folder (site/ is left alone)."""
    target = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return target


def page_text(site: Path, page: str) -> str:
    """A built page's article as text (tags dropped, entities decoded)."""
    document = (site / page / "index.html").read_text()
    article = document.split("<article", 1)[1].split("</article>", 1)[0]
    return html.unescape(re.sub(r"<[^>]+>", " ", article))


def test_site_builds_strictly(site: Path):
    assert (site / "index.html").is_file()
    assert not any(site.rglob("_gen")), "the generators are not pages"


def test_generated_pages_hold_what_the_code_holds(site: Path):
    settings = page_text(site, "reference/settings")
    assert all(f"STEPQ_{name.upper()}" in settings for name in Settings.model_fields if name != "module_models")
    assert "generated:" not in settings  # the marker was replaced, not left as a comment
    cli = page_text(site, "reference/cli")
    for command in ("stepq worker", "stepq run", "stepq policy set", "stepq batch submit", "stepq tenant-key show"):
        assert command in cli, command
    events = page_text(site, "reference/events")
    assert all(f"EventType.{member.name}" in events for member in stepq.EventType)
    http_api = page_text(site, "reference/http-api")
    assert "POST /v1/turns" in http_api and "GET /v1/turns/{turn_id}/events" in http_api
    # each route's own credential line: between its heading and the next heading's ¶
    assert re.search(r"POST /v1/turns\s+¶\s+Submit\.[^¶]*Credential:\s+scope\s+submit", http_api)
    assert re.search(r"GET /healthz\s+¶[^¶]*Credential:\s+none", http_api)
    errors = page_text(site, "reference/errors")
    assert all(name in errors for name in stepq.__all__ if name.endswith("Error"))
    python_api = page_text(site, "reference/python-api")
    assert "submit(" in python_api and "Submit turns and follow them" in python_api  # Client's docstring


def test_every_exported_name_needs_an_entry():
    hooks = _hooks()
    page = (ROOT / "docs" / "reference" / "python-api.md").read_text()
    assert hooks.missing_api_names(page) == []
    without = page.replace("::: stepq.ThreadTurn\n", "")
    assert hooks.missing_api_names(without) == ["`ThreadTurn` (in stepq.__all__) has no `::: stepq.ThreadTurn`"]
    with pytest.raises(PluginError, match="ThreadTurn"):
        hooks.on_page_markdown(without, page=_page("reference/python-api.md"))


def test_every_event_type_needs_a_section():
    hooks = _hooks()
    page = (ROOT / "docs" / "reference" / "events.md").read_text()
    assert "### `step-batched`" in page
    without = page.replace("### `step-batched`", "### step batched")
    with pytest.raises(PluginError, match="'step-batched' has no"):
        hooks.on_page_markdown(without, page=_page("reference/events.md"))


def test_an_unknown_marker_fails_the_build():
    with pytest.raises(PluginError, match="no generator named 'setings'"):
        _hooks().on_page_markdown("<!-- generated: setings -->", page=_page("reference/settings.md"))


def _page(src_uri: str) -> Any:
    """What on_page_markdown reads of mkdocs' Page: its file's path in docs/."""
    return type("Page", (), {"file": type("File", (), {"src_uri": src_uri})()})()
