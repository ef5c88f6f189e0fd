"""Tool declarations for Gemini: function names sanitized to Google's rules, JSON Schema narrowed to its subset.

Google rejects a declaration whose name does not start with a letter or underscore, holds
characters other than a-z A-Z 0-9 `_ . -`, or is longer than 64 characters (the API's own
400 message; some docs also allow colons, so we stay with the stricter set). `wire_name` is a
pure function of the tool name, so the same tool gets the same wire name on every step and on
every worker; a changed name carries a hash of the original, so two tools never collide.

`parameters` is an OpenAPI-3.0 subset: no `$ref`, no `additionalProperties`, one `type` per
schema, `nullable` instead of a null type, objects need declared properties, arrays need `items`.
What can be rewritten is rewritten (refs inlined, null unions folded into `nullable`, non-string
enums moved into the description); what cannot raises `DefinitionError` naming the tool and path.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from stepq.errors import DefinitionError
from stepq.models import ToolSpec

MAX_NAME = 64
_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9_.\-]")
_TYPES = {"string": "STRING", "number": "NUMBER", "integer": "INTEGER", "boolean": "BOOLEAN"}
_TYPES.update({"array": "ARRAY", "object": "OBJECT"})
_FORMATS = {"STRING": {"enum", "date-time"}, "NUMBER": {"float", "double"}, "INTEGER": {"int32", "int64"}}


# --------------------------------------------------------------------------- names


def wire_name(name: str) -> str:
    """The declaration name Gemini accepts for `name`: itself when valid, else a sanitized form + hash."""
    if _VALID_NAME.match(name):
        return name
    base = _INVALID_CHAR.sub("_", name)
    if not base or not (base[0].isascii() and (base[0].isalpha() or base[0] == "_")):
        base = "_" + base
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{base[: MAX_NAME - 9]}_{digest}"


def name_map(names: list[str]) -> dict[str, str]:
    """wire name -> original name for a tool list; raises DefinitionError on a (practically impossible) collision."""
    mapping: dict[str, str] = {}
    for name in names:
        wire = wire_name(name)
        other = mapping.get(wire)
        if other is not None and other != name:
            raise DefinitionError(
                f"tools {other!r} and {name!r} map to the same Gemini function name {wire!r}; rename one of them"
            )
        mapping[wire] = name
    return mapping


# --------------------------------------------------------------------------- schemas


class _SchemaError(ValueError):
    """A JSON Schema construct Gemini's function parameters cannot express."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or '(root)'}: {problem}")


def _resolve(ref: str, root: dict[str, Any], path: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise _SchemaError(path, f"$ref {ref!r} points outside the schema; only local refs can be inlined")
    node: Any = root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or token not in node:
            raise _SchemaError(path, f"$ref {ref!r} does not resolve")
        node = node[token]
    if not isinstance(node, dict):
        raise _SchemaError(path, f"$ref {ref!r} is not a schema object")
    return node


def _note(description: str | None, extra: str) -> str:
    return f"{description} ({extra})" if description else extra


def _convert(schema: Any, root: dict[str, Any], path: str, refs: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise _SchemaError(path, "a schema must be an object (true/false schemas have no Gemini form)")
    schema = dict(schema)
    ref = schema.pop("$ref", None)
    if isinstance(ref, str):
        if ref in refs:
            raise _SchemaError(path, f"recursive $ref {ref!r} cannot be inlined for Gemini")
        return _convert({**_resolve(ref, root, path), **schema}, root, path, (*refs, ref))
    all_of = schema.pop("allOf", None)
    if all_of is not None:
        if not isinstance(all_of, list) or len(all_of) != 1:
            raise _SchemaError(path, "allOf with several schemas cannot be expressed; merge them into one")
        return _convert({**all_of[0], **schema}, root, path, refs)

    union = schema.pop("anyOf", None) or schema.pop("oneOf", None)
    types = schema.get("type")
    if isinstance(types, list):
        if union is not None:
            raise _SchemaError(path, "a type list together with anyOf/oneOf cannot be expressed")
        rest = {k: v for k, v in schema.items() if k != "type"}
        union = [{**rest, "type": t} for t in types]
        schema = {k: v for k, v in schema.items() if k in ("description", "default")}
    if union is not None:
        return _convert_union(union, schema, root, path, refs)
    return _convert_single(schema, root, path, refs)


def _convert_union(
    branches: Any, outer: dict[str, Any], root: dict[str, Any], path: str, refs: tuple[str, ...]
) -> dict[str, Any]:
    if not isinstance(branches, list) or not branches:
        raise _SchemaError(path, "anyOf/oneOf must be a non-empty list")
    nullable = any(isinstance(b, dict) and b.get("type") == "null" for b in branches)
    rest = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
    if not rest:
        raise _SchemaError(path, "a value that can only be null cannot be expressed")
    if len(rest) == 1:
        merged = {**rest[0], **{k: v for k, v in outer.items() if k != "type"}}
        out = _convert(merged, root, path, refs)
    else:
        out = {"anyOf": [_convert(b, root, f"{path}/anyOf[{i}]", refs) for i, b in enumerate(rest)]}
        if isinstance(outer.get("description"), str):
            out["description"] = outer["description"]
    if nullable:
        out["nullable"] = True
    return out


def _infer_type(schema: dict[str, Any], path: str) -> str:
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return "string"
    raise _SchemaError(path, "has no type; Gemini needs every value to declare one (string, integer, object, ...)")


def _convert_single(schema: dict[str, Any], root: dict[str, Any], path: str, refs: tuple[str, ...]) -> dict[str, Any]:
    json_type = schema.get("type") or _infer_type(schema, path)
    if not isinstance(json_type, str):
        raise _SchemaError(path, f"type must be a string, got {json_type!r}")
    if json_type == "null":
        raise _SchemaError(path, "a value that can only be null cannot be expressed")
    gem_type = _TYPES.get(json_type)
    if gem_type is None:
        raise _SchemaError(path, f"unknown type {json_type!r}")
    out: dict[str, Any] = {"type": gem_type}
    description = schema.get("description") if isinstance(schema.get("description"), str) else None

    values = schema.get("enum")
    if "const" in schema:
        values = [schema["const"]]
    if isinstance(values, list):
        if gem_type == "STRING" and all(isinstance(v, str) for v in values):
            out["enum"] = list(values)
            out["format"] = "enum"
        else:  # Gemini enums are strings only; keep the constraint visible to the model
            description = _note(description, "allowed values: " + ", ".join(json.dumps(v) for v in values))
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS.get(gem_type, set()) and "format" not in out:
        out["format"] = fmt
    if description:
        out["description"] = description
    if "default" in schema and schema["default"] is not None:
        out["default"] = schema["default"]

    if gem_type in ("NUMBER", "INTEGER"):
        _copy_bounds(schema, out, gem_type)
    elif gem_type == "STRING":
        for key, wire in (("minLength", "minLength"), ("maxLength", "maxLength"), ("pattern", "pattern")):
            if key in schema:
                out[wire] = schema[key]
    elif gem_type == "ARRAY":
        if "prefixItems" in schema:
            raise _SchemaError(path, "tuple arrays (prefixItems) cannot be expressed; use one item type")
        if "items" not in schema or not isinstance(schema["items"], dict):
            raise _SchemaError(path, "an array needs an `items` schema for Gemini")
        out["items"] = _convert(schema["items"], root, f"{path}/items", refs)
        for key in ("minItems", "maxItems"):
            if key in schema:
                out[key] = schema[key]
    elif gem_type == "OBJECT":
        props = schema.get("properties") or {}
        if not props:
            raise _SchemaError(
                path, "a free-form object (no declared properties) cannot be expressed; declare its fields"
            )
        out["properties"] = {
            name: _convert(sub, root, f"{path}/{name}", refs) for name, sub in props.items() if isinstance(name, str)
        }
        required = [r for r in schema.get("required", []) if r in props]
        if required:
            out["required"] = required
    return out


def _copy_bounds(schema: dict[str, Any], out: dict[str, Any], gem_type: str) -> None:
    for key in ("minimum", "maximum"):
        if isinstance(schema.get(key), int | float):
            out[key] = schema[key]
    step = 1 if gem_type == "INTEGER" else 0
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        out["minimum"] = schema["exclusiveMinimum"] + step  # our own validator keeps the exact bound
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        out["maximum"] = schema["exclusiveMaximum"] - step


def convert_parameters(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The Gemini `parameters` for a tool's input schema; None for a tool that takes no arguments."""
    root = schema
    top = dict(schema)
    ref = top.pop("$ref", None)
    if isinstance(ref, str):
        top = {**_resolve(ref, root, ""), **top}
    if top.get("type", "object") != "object":
        raise _SchemaError("", "a tool's input schema must be an object")
    if not top.get("properties"):
        return None  # Gemini rejects an OBJECT with no properties; a no-argument tool omits `parameters`
    return _convert({**top, "type": "object"}, root, "", ())


def function_declaration(spec: ToolSpec) -> dict[str, Any]:
    """One functionDeclaration (camelCase, as on the wire). Raises DefinitionError when it cannot be expressed."""
    try:
        parameters = convert_parameters(spec.input_schema)
    except _SchemaError as exc:
        raise DefinitionError(f"tool {spec.name!r} cannot be declared to Gemini: {exc}") from None
    decl: dict[str, Any] = {"name": wire_name(spec.name), "description": spec.description}
    if parameters is not None:
        decl["parameters"] = parameters
    return decl


def check_tools(specs: list[ToolSpec]) -> None:
    """Raise DefinitionError when a tool's name or schema cannot be expressed for Gemini."""
    name_map([s.name for s in specs])
    for spec in specs:
        function_declaration(spec)
