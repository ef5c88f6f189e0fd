"""The settings reference from `stepq.config.settings.Settings`: every field's variable, type, default and
description (the field's docstring), grouped under the section comments of the class body."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from enum import Enum
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import NoDecode

from stepq.config.settings import SECRET_SETTINGS, Settings
from stepq_docgen import escape_text

# fields read from a family of variables rather than one (see stepq.config.module_models)
FAMILIES = {"module_models": ("STEPQ_<MODULE>_PROVIDER", "STEPQ_<MODULE>_MODEL")}
FIRST_GROUP = "Connection, agents and secrets"
_LIMITS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "at least"))


def variables(name: str) -> tuple[str, ...]:
    """The environment variable(s) a field is read from."""
    return FAMILIES.get(name, (f"STEPQ_{name.upper()}",))


def groups() -> list[tuple[str, list[str]]]:
    """The fields in declaration order, under the class body's section comments (`# Observability`...):
    a comment line after a blank line that starts with a capital letter opens a section."""
    source = textwrap.dedent(inspect.getsource(Settings))
    lines = source.splitlines()
    fields = {
        node.lineno: node.target.id
        for node in ast.parse(source).body[0].body  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    result: list[tuple[str, list[str]]] = [(FIRST_GROUP, [])]
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if text.startswith("# ") and text[2:3].isupper() and not lines[number - 2].strip():
            title = text[2:].split(" (")[0].split(":")[0].split(";")[0].strip()
            result.append((title, []))
        if number in fields and fields[number] in Settings.model_fields:
            result[-1][1].append(fields[number])
    return [(title, names) for title, names in result if names]


def type_of(field: FieldInfo) -> str:
    """How the value is written in the environment."""
    annotation = field.annotation
    optional = False
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        annotation = args[0] if len(args) == 1 else annotation
    origin = get_origin(annotation)
    if NoDecode in field.metadata:
        text = "comma-separated list"
    elif origin is dict:
        text = "JSON object"
    elif origin is list:
        text = "JSON list"
    elif annotation is SecretStr:
        text = "secret string"
    else:
        words: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
        text = words.get(annotation, str(annotation))
    bounds = [f"{sign} {getattr(m, attr)}" for m in field.metadata for attr, sign in _LIMITS if hasattr(m, attr)]
    pattern = next((m.pattern for m in field.metadata if getattr(m, "pattern", None)), None)
    if pattern:
        bounds.append(f"matching `{pattern}`")
    if bounds:
        text += ", " + ", ".join(bounds)
    return text + (", optional" if optional else "")


def default_of(name: str, field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if value == []:
        return "empty"
    if isinstance(value, dict) and all(isinstance(v, BaseModel) for v in value.values()):
        return ", ".join(f"`{key}`" for key in value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    shown = f"`{value}`" if not isinstance(value, dict | list) else f"`{value!r}`"
    if isinstance(value, int) and name.endswith("_bytes") and value >= 2**20 and value % 2**20 == 0:
        shown += f" ({value // 2**20} MiB)"
    elif isinstance(value, int) and name.endswith("_s") and value >= 86400 and value % 86400 == 0:
        days = value // 86400
        shown += f" ({days} day{'s' if days > 1 else ''})"
    return shown


def render() -> str:
    out: list[str] = []
    for title, names in groups():
        out.append(f"## {title}\n")
        for name in names:
            field = Settings.model_fields[name]
            out.append(f"### {' / '.join(f'`{v}`' for v in variables(name))}\n")
            facts = f"**Type:** {type_of(field)} · **Default:** {default_of(name, field)}"
            if name in SECRET_SETTINGS or "SecretStr" in repr(field.annotation):
                facts += " · **Secret:** never echoed in an error message"
            out.append(facts + "\n")
            out.append(escape_text(" ".join((field.description or "").split())) + "\n")
    return "\n".join(out)
