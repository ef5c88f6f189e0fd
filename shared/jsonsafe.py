"""JSON that every parser takes, written and read fast on the per-delta paths.

JSON has no NaN or Infinity. Python's `json` writes them anyway (as `NaN`, `Infinity`), which other JSON
parsers (a browser, `jq`, Go, the gateway's clients) reject. stepq refuses them where a caller hands them
in (metadata, context: `caller_json_problem` names the spot) and maps them to strings where a tool or a provider
produced them (`finite`, and `dumps`), so every event, stored result and transcript is valid JSON.

Every streamed delta is parsed from its SSE event's JSON on the provider loop (`loads`), and every event is
written as a JSON envelope (`dumps`). With the stdlib those were ~4.6 µs and ~5.1 µs (~7 µs of a streamed
delta's ~100 µs of worker CPU); pydantic-core's Rust codec (installed with pydantic) does them in ~0.9 and ~0.7.
Where it refuses what the stdlib takes (a lone surrogate, a byte-order mark) or cannot write a value, the
stdlib decides: the value is read or written as before, or fails with the stdlib's error. (Written, a few
types the stdlib refuses, such as a datetime or a set, come out as pydantic writes them; events hold none.)"""

from __future__ import annotations

import json
import math
from typing import Any

import pydantic_core

_NAMES = {math.inf: "Infinity", -math.inf: "-Infinity"}


def non_finite_path(value: Any, path: str = "$") -> str | None:
    """Where the first NaN/Infinity in a JSON-like value is (`$.a[2]`), or None if there is none."""
    found = _first_problem(value, path, keys=False)
    return None if found is None else found[0]


def caller_json_problem(value: Any, name: str) -> str | None:
    """What keeps a caller's value (`name`: `metadata`, `context`) from being stored as JSON every parser reads,
    in words naming the spot (a NaN/Infinity, a key that is not a string); None when nothing does."""
    found = _first_problem(value, name, keys=True)
    if found is None:
        return None
    path, key = found
    if key:
        return f"{path} has a key that is not a string ({key}); JSON object keys are strings"
    return f"{path} is NaN or Infinity, which JSON cannot carry: send null or a string"


def _first_problem(value: Any, path: str, keys: bool) -> tuple[str, str] | None:
    """(path, '') of the first NaN/Infinity, or (with `keys`) (path, repr of the key) of the first key that is not
    a string."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, "")
    if isinstance(value, dict):
        for key, item in value.items():
            if keys and not isinstance(key, str):
                return path, repr(key)
            found = _first_problem(item, f"{path}.{key}", keys)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _first_problem(item, f"{path}[{i}]", keys)
            if found:
                return found
    return None


def finite(value: Any) -> Any:
    """The value with every NaN/Infinity replaced by the string "NaN" / "Infinity" / "-Infinity"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _NAMES.get(value, "NaN")
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def loads(data: bytes | str) -> Any:
    """`json.loads`, parsed by jiter (numbers, escapes and duplicate keys come out as the stdlib's)."""
    try:
        return pydantic_core.from_json(data)
    except ValueError:
        return json.loads(data)  # what the stdlib still reads (a BOM, a lone surrogate), or its JSONDecodeError


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and ±Infinity as the strings `finite` writes, so it is always valid."""
    try:
        return pydantic_core.to_json(value, inf_nan_mode="strings")
    except ValueError:  # PydanticSerializationError: the stdlib's output, or its TypeError for what JSON lacks
        return json.dumps(finite(value), separators=(",", ":")).encode()  # ASCII: a lone surrogate is escaped
