"""`jsonsafe.loads` / `dumps`: pydantic-core's codec on the per-delta paths, with the stdlib's answers kept."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from stepq import jsonsafe


def _strict(data: bytes) -> Any:
    """Parse as JSON every parser takes: no NaN / Infinity constants."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(data, parse_constant=refuse)


@pytest.mark.parametrize(
    "data",
    [
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}',
        '{"é":"ü \\u2028 \\ud83d\\ude00"}',
        b'{"a":1,"a":2}',  # the last duplicate wins
        b"123456789012345678901234567890",
        b"[1.0000000000000002, 0.1, 1e-5, -0.0, 5e-324]",
        b"1e400",  # out of range: inf, as the stdlib reads it
        b"[NaN, Infinity, -Infinity]",
        b'"\\ud800"',  # a lone surrogate: the stdlib keeps it
        b'\xef\xbb\xbf{"bom":true}',  # a UTF-8 byte-order mark: the stdlib skips it
    ],
)
def test_loads_reads_what_the_stdlib_reads(data: bytes | str) -> None:
    got, expected = jsonsafe.loads(data), json.loads(data)
    assert repr(got) == repr(expected)  # repr: NaN equals nothing, and -0.0 == 0.0


@pytest.mark.parametrize("data", [b'{"a":', b'{"a":1} x', b"", b"{'a':1}"])
def test_loads_fails_with_the_stdlibs_error(data: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        jsonsafe.loads(data)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            {"text": "é\n\u2028", "n": 3, "ts": 1733390000.123456},
            {"text": "é\n\u2028", "n": 3, "ts": 1733390000.123456},
        ),
        ({"nan": math.nan, "list": [1.5, math.inf, -math.inf]}, {"nan": "NaN", "list": [1.5, "Infinity", "-Infinity"]}),
        ({1: (2, 3)}, {"1": [2, 3]}),
        ({"lone": "\ud800x", "x": math.nan}, {"lone": "\ud800x", "x": "NaN"}),  # the stdlib's path: escaped
    ],
)
def test_dumps_writes_compact_valid_json(value: Any, expected: Any) -> None:
    data = jsonsafe.dumps(value)
    assert isinstance(data, bytes)
    assert _strict(data) == expected
    assert b", " not in data and b": " not in data


def test_dumps_refuses_what_json_cannot_hold_with_the_stdlibs_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonsafe.dumps({"x": object()})
