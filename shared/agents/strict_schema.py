"""Strict tool schemas: what a provider's strict mode (grammar-constrained arguments) can take, checked at load.

OpenAI (`strict: true` on a function) and Anthropic (`strict: true` on a tool) constrain the model's arguments
to the schema, but only for a subset of JSON Schema: every object closes itself (`additionalProperties:
false`) and lists every property in `required` (an optional value is a required property that may be null).
An agent that asks for strict tools is checked against that subset when it loads, so a schema the API would
reject with a 400 in the middle of a turn is refused at start, in one line naming the tool and the problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# keywords whose values are schemas (or lists/maps of schemas) a strict check walks into
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("$defs", "definitions")


def strict_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot go out as a strict tool schema, or None when it can."""
    for where, node in _objects(schema, ""):
        shown = f" at {where!r}" if where else ""
        if node.get("additionalProperties") is not False:
            return f"strict schemas need additionalProperties false on every object; the object{shown} allows more"
        properties = node.get("properties") or {}
        required = set(node.get("required") or [])
        optional = [name for name in properties if name not in required]
        if optional:
            prefix = f"{where}." if where else ""
            return (
                "strict schemas need every property required; "
                + ", ".join(repr(prefix + name) for name in optional)
                + (" is optional" if len(optional) == 1 else " are optional")
            )
    return None


def _objects(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema under `node` with its dotted path (`address.city`; `[]` for array items)."""
    if not isinstance(node, dict):
        return
    if node.get("type") == "object" or "properties" in node:
        yield where, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _objects(sub, f"{where}.{name}" if where else name)
    if isinstance(node.get("items"), dict):
        yield from _objects(node["items"], f"{where}[]")
    for key in _SUBSCHEMA_LISTS:
        for sub in node.get(key) or []:
            yield from _objects(sub, where)
    for key in _SUBSCHEMA_MAPS:
        for name, sub in (node.get(key) or {}).items():
            yield from _objects(sub, name)
