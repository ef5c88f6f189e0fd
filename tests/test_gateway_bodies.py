"""A request body the gateway cannot read is a 422 in words a caller understands, not pydantic's internals
("Input should be a valid dictionary or object to extract fields from", "JSON decode error at 10").
Real uvicorn and httpx sending the bytes a careless or hostile caller sends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import make_settings
from tests.gateway_support import Served, api_keys_setting, serve

JSON = {"content-type": "application/json"}


@pytest.fixture
def gw(prefix: str) -> Iterator[Served]:
    with serve(make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)) as served:
        yield served


def _message(gw: Served, content: bytes, headers: dict[str, str]) -> str:
    with gw.client() as http:
        response = http.post("/v1/turns", content=content, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid-request"
    return str(response.json()["error"]["message"])


def test_a_body_sent_without_a_json_content_type_is_named_as_such(gw: Served) -> None:
    body = b'{"agent": "rt.basic", "prompt": "hi"}'
    assert _message(gw, body, {}) == "the body must be JSON (Content-Type: application/json)"
    assert (
        _message(gw, body, {"content-type": "text/plain"}) == "the body must be JSON (Content-Type: application/json)"
    )


def test_malformed_json_names_the_line_and_column(gw: Served) -> None:
    assert _message(gw, b'{"agent": x}', JSON) == "the body is not valid JSON: Expecting value at line 1, column 11"
    two_lines = b'{"agent": "rt.basic",\n "prompt": "hi",}'
    assert _message(gw, two_lines, JSON) == (
        "the body is not valid JSON: Expecting property name enclosed in double quotes at line 2, column 17"
    )


def test_a_body_that_is_not_a_json_object_or_is_missing_says_so(gw: Served) -> None:
    assert _message(gw, b'["rt.basic", "hi"]', JSON) == "the body must be a JSON object, not an array"
    assert _message(gw, b"", JSON) == "the body is missing: send a JSON object (Content-Type: application/json)"
