"""The event types from `stepq.models.EventType`, and a check that the events page documents each one.

The types' `data` fields are plain dicts in the code (each publisher writes its own), so their tables are
prose on the page; what the code does hold, the list of types and the envelope, is generated here, and
`missing_sections` fails the build when a type has no section of its own (or a section names no type)."""

from __future__ import annotations

import re

from stepq.models import CONTENT_EVENTS, Event, EventType

_SECTION = re.compile(r"^### `([a-z-]+)`\s*$", re.MULTILINE)


def _annotation(annotation: object) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def render() -> str:
    out = ["| Type | Member | Kind |", "|---|---|---|"]
    for member in EventType:
        kind = "content (streamed, coalesced)" if member in CONTENT_EVENTS else "bookkeeping"
        out.append(f"| [`{member.value}`](#{member.value}) | `EventType.{member.name}` | {kind} |")
    out += ["", f"The envelope's fields (`stepq.Event`): {', '.join(f'`{n}`' for n in Event.model_fields)}.", ""]
    return "\n".join(out)


def missing_sections(markdown: str) -> list[str]:
    """Problems with the page's `### \\`type\\`` sections: a type without one, or one naming no type."""
    sections = set(_SECTION.findall(markdown))
    known = {member.value for member in EventType}
    problems = [f"event type {t!r} has no `### \\`{t}\\`` section" for t in sorted(known - sections)]
    problems += [f"section `{t}` names no EventType member" for t in sorted(sections - known)]
    return problems
