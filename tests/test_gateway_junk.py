"""Every route of the gateway answers junk with a 4xx naming the problem, never a 500.

The routes come from the app's own OpenAPI document (plus the web pages'), so a route added later is swept
too. Each is called with junk in every path parameter, in each query parameter alone, in `Last-Event-ID` and
in the body, both with made-up ids and with the ids of a real turn and thread, on a real uvicorn.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.conftest import make_settings
from tests.gateway_support import api_keys_setting, serve

JUNK = ["", "-1", "0", "9" * 30, "1e309", "nan", "nan:x", "%00", "..%2F..", "a" * 3000, "é", "[]", "null"]
WEB_PAGES = {"/ui/{name}", "/console/{name}", "/ui/vendor/{name}"}
BODY_FIELDS = ("agent", "prompt", "messages", "approved", "args", "results", "thread_id", "metadata", "loop", "id")


def bodies(junk: str) -> list[str]:
    return [
        "",
        "{",
        "[]",
        json.dumps({field: junk for field in BODY_FIELDS}),
        json.dumps({"agent": "demo.support", "prompt": junk, "metadata": {"a": junk}, "loop": {"max_steps": junk}}),
        json.dumps({"messages": [{"role": "user", "parts": [{"type": "text", "text": junk}]}], "id": junk}),
        '{"agent": "demo.support", "prompt": "hi", "loop": {"budget": {"max_wall_clock_s": 1e309}}}',
    ]


def operations(spec: dict[str, Any]) -> list[tuple[str, str, list[str], list[str], bool]]:
    """(method, path, path parameters, query parameters, takes a body) of every route."""
    found = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            params = op.get("parameters", [])
            found.append(
                (
                    method.upper(),
                    path,
                    [p["name"] for p in params if p["in"] == "path"],
                    [p["name"] for p in params if p["in"] == "query"],
                    "requestBody" in op,
                )
            )
    found += [("GET", page, ["name"], [], False) for page in WEB_PAGES]
    return found


def test_no_route_answers_junk_with_a_server_error(prefix: str) -> None:
    settings = make_settings(prefix, api_keys=api_keys_setting())
    failures: list[str] = []
    with serve(settings) as gw, gw.client() as http:
        spec = http.get("/openapi.json").json()
        turn = http.post("/v1/turns", json={"agent": "demo.support", "prompt": "hi"}).json()["turn_id"]
        thread = http.post("/v1/threads", json={"agent": "demo.support"}).json()["thread_id"]
        real = {"turn_id": turn, "thread_id": thread}
        routes = operations(spec)
        assert len(routes) >= 20, [r[1] for r in routes]  # the sweep reaches the whole API
        for method, path, path_params, query_params, has_body in routes:
            for junk in JUNK:
                for use_real in (False, True):
                    url = path
                    for name in path_params:
                        url = url.replace(f"{{{name}}}", real.get(name, "x") if use_real else (junk or "x"))
                    header = junk if junk.isascii() and junk.strip() and len(junk) < 100 else "1"
                    # the body's junk with no query, then each query parameter's junk alone (another one's
                    # refusal would otherwise hide what this one does)
                    tries: list[tuple[dict[str, str], str | None]] = [
                        ({}, b) for b in (bodies(junk) if has_body else [None])
                    ]
                    tries += [({name: junk}, None if not has_body else "{}") for name in query_params]
                    for params, body in tries:
                        what = f"{method} {url[:80]} params={str(params)[:60]} body={(body or '')[:60]!r}"
                        try:
                            answer = http.request(
                                method,
                                url,
                                params=params,
                                content=body,
                                headers={"last-event-id": header, "content-type": "application/json"},
                                timeout=2,
                            )
                        except httpx.ReadTimeout:
                            continue  # a live stream of the real turn: it answered, and waits for events
                        except httpx.TransportError as exc:  # the server dropped the connection: it crashed
                            failures.append(f"{what}: {exc!r}")
                            continue
                        if answer.status_code >= 500:
                            failures.append(f"{what}: {answer.status_code} {answer.text[:100]}")
    assert not failures, "\n".join(failures[:20])
