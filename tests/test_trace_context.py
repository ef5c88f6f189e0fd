"""The turn's W3C trace context is stored at submit: from `Client.submit`'s current OpenTelemetry span (or
its `traceparent=`), from the gateway's `traceparent` header (a real uvicorn); a malformed one is ignored,
never a refusal. (That every step's spans join it: tests/test_otel_traces.py.)"""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider

from tests.conftest import make_settings
from tests.gateway_support import api_keys_setting, serve

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_client_submit_stores_the_callers_current_span_as_the_turns_parent(rt, client):
    tracer = TracerProvider().get_tracer("caller")
    with tracer.start_as_current_span("handle request") as span:
        handle = client.submit("otel_t.hooked", prompt="go")
        context = span.get_span_context()
    flags = int(context.trace_flags)
    assert rt.turns.load(handle.turn_id).traceparent == f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"

    outside = client.submit("otel_t.hooked", prompt="go")  # no span active: a root trace of its own
    assert rt.turns.load(outside.turn_id).traceparent is None
    given = client.submit("otel_t.hooked", prompt="go", traceparent=GOOD)
    assert rt.turns.load(given.turn_id).traceparent == GOOD


def test_the_gateway_stores_the_requests_traceparent_and_ignores_a_malformed_one(prefix, rt):
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)
    with serve(settings) as served, served.client() as http:
        stored = []
        for header in (GOOD, "00-not-a-trace-01", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"):
            response = http.post(
                "/v1/turns", json={"agent": "otel_t.hooked", "prompt": "go"}, headers={"traceparent": header}
            )
            assert response.status_code == 201, response.text
            stored.append(rt.turns.load(response.json()["turn_id"]).traceparent)
    assert stored == [GOOD, None, None]


def test_the_chat_route_stores_the_requests_traceparent(prefix, rt):
    """POST /v1/chat (the AI SDK's `useChat` endpoint) joins the caller's trace as /v1/turns does."""
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)
    message = {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}
    body = {"id": "traced-chat", "messages": [message], "trigger": "submit-message"}
    with (
        serve(settings) as served,
        served.client() as http,
        http.stream("POST", "/v1/chat?agent=otel_t.hooked", json=body, headers={"traceparent": GOOD}) as response,
    ):
        assert response.status_code == 200, response.read()
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    start = json.loads(first.removeprefix("data: "))
    assert start["type"] == "start"
    assert rt.turns.load(start["messageMetadata"]["turnId"]).traceparent == GOOD
