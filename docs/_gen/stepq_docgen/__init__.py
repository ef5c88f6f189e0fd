"""Generators of the site's Reference pages: each renders Markdown from the code it documents.

`docs/_gen/hooks.py` (mkdocs `hooks:`) replaces a page's `<!-- generated: NAME -->` marker with
`render(NAME)` at build time, so the pages cannot drift from the code: no hand-kept copy exists.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MARKER = "<!-- generated: {} -->"
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def escape_text(text: str) -> str:
    """Text from docstrings and help strings as Markdown: `<seq>` outside code spans is not an HTML tag."""
    parts = _CODE_SPAN.split(text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)


def generators() -> dict[str, Callable[[], str]]:
    """Each marker name and the function that renders it (imported late: a page builds only what it uses)."""
    from stepq_docgen import cli_ref, errors_ref, events_ref, http_ref, settings_ref

    return {
        "settings": settings_ref.render,
        "cli": cli_ref.render,
        "event-types": events_ref.render,
        "http-api": http_ref.render,
        "errors": errors_ref.render,
    }
