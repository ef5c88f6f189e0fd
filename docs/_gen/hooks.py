"""mkdocs hooks (mkdocs.yml `hooks:`): the Reference pages' generated parts, filled in at build time.

- on_config lays out `build/docs-api/stepq` as the installed package is (shared/ + workers/ + producer/, the
  editable install's package-dir mapping, which griffe cannot follow), so mkdocstrings reads `stepq` statically.
- on_page_markdown replaces each `<!-- generated: NAME -->` marker with its generator's Markdown, and fails the
  build when a page the code must cover does not: an event type without a section, an exported name
  missing from the Python API page.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
API_TREE = ROOT / "build" / "docs-api"  # mkdocs.yml's mkdocstrings `paths:`
sys.path.insert(0, str(HERE))

from stepq_docgen import MARKER, generators  # noqa: E402  (found through the path above)

_MARKER = re.compile(MARKER.format(r"([a-z-]+)"))
_DIRECTIVE = re.compile(r"^::: stepq\.(\w+)\s*$", re.MULTILINE)


def link_tree(target: Path = API_TREE) -> Path:
    """`target/stepq` as the installed package: shared/'s entries, plus workers/ and producer/ (as `make lint`'s)."""
    package = target / "stepq"
    package.mkdir(parents=True, exist_ok=True)
    entries = {entry.name: entry for entry in (ROOT / "shared").iterdir() if entry.name != "__pycache__"}
    entries |= {"workers": ROOT / "workers", "producer": ROOT / "producer"}
    for stale in package.iterdir():
        if stale.name not in entries or stale.resolve() != entries[stale.name].resolve():
            stale.unlink()
    for name, source in entries.items():
        link = package / name
        if not link.is_symlink():
            with contextlib.suppress(FileExistsError):  # another build made it meanwhile
                link.symlink_to(source)
    return target


@event_priority(100)  # before mkdocstrings' own on_config, which keeps only the `paths:` that exist
def on_config(config: Any) -> Any:
    link_tree()
    return config


def missing_api_names(markdown: str) -> list[str]:
    """Problems with the Python API page: a `stepq.__all__` name without its `::: stepq.NAME`, or one extra."""
    import stepq

    documented = _DIRECTIVE.findall(markdown)
    exported = set(stepq.__all__) - {"__version__"}
    problems = [f"`{name}` (in stepq.__all__) has no `::: stepq.{name}`" for name in sorted(exported - set(documented))]
    problems += [f"`::: stepq.{name}` is not in stepq.__all__" for name in sorted(set(documented) - exported)]
    problems += [
        f"`::: stepq.{name}` appears twice" for name in sorted({n for n in documented if documented.count(n) > 1})
    ]
    return problems


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    path = page.file.src_uri
    if path == "reference/python-api.md":
        _fail(path, missing_api_names(markdown))
    if path == "reference/events.md":
        from stepq_docgen import events_ref

        _fail(path, events_ref.missing_sections(markdown))
    known = generators()

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in known:
            raise PluginError(f"{path}: no generator named {name!r} (known: {', '.join(known)})")
        return known[name]()

    return _MARKER.sub(fill, markdown)


def _fail(path: str, problems: list[str]) -> None:
    if problems:
        raise PluginError(f"{path}: " + "; ".join(problems))
