"""JSON has no NaN or Infinity. Python's `json` writes them anyway (as `NaN`, `Infinity`), which other JSON
parsers (a browser, `jq`, Go, the gateway's clients) reject. stepq refuses them where a caller hands them
in (metadata: `non_finite_path` names the spot) and maps them to strings where a tool or a provider
produced them (`finite`), so every event, stored result and transcript is valid JSON."""

from __future__ import annotations

import math
from typing import Any

_NAMES = {math.inf: "Infinity", -math.inf: "-Infinity"}


def non_finite_path(value: Any, path: str = "$") -> str | None:
    """Where the first NaN/Infinity in a JSON-like value is (`$.a[2]`), or None if there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            found = non_finite_path(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = non_finite_path(item, f"{path}[{i}]")
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
