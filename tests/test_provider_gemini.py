"""The Gemini adapter end to end: the unmodified google-genai SDK against a local fake that speaks the
real SSE protocol, driven through full stepq turns on an in-process Celery worker and real Redis."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from google.genai import errors as genai_errors
from pydantic import BaseModel

from stepq.errors import DefinitionError, SubmitError
from stepq.models import EventType, FinishReason, ToolSpec, TurnStatus
from stepq.providers.gemini import adapter as gemini
from stepq.providers.gemini.errors import classify
from stepq.providers.gemini.schema import check_tools, convert_parameters, wire_name
from stepq.providers.gemini.wire import map_finish_reason
from tests.agents_gemini import ODD_TOOL
from tests.conftest import make_settings
from tests.fakes import gemini_server as g

API_KEY = "test-gemini-key-0123456789"
_GOOGLE_VARS = (
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_ENTERPRISE",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_VERTEX_BASE_URL",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_GENAI_API_VERSION",
)


@pytest.fixture
def settings(prefix: str):  # every delta its own event, so "several text-delta events" is observable
    return make_settings(prefix, coalesce_window_ms=0.0)


@pytest.fixture
def fake():
    server = g.FakeGemini().start()
    yield server
    server.stop()


def _clear_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in _GOOGLE_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def studio(monkeypatch: pytest.MonkeyPatch, fake: g.FakeGemini) -> g.FakeGemini:
    """AI Studio through the SDK's standard variables."""
    _clear_env(monkeypatch)
    monkeypatch.setenv("GOOGLE_API_KEY", API_KEY)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
    return fake


@pytest.fixture
def vertex(monkeypatch: pytest.MonkeyPatch, fake: g.FakeGemini, tmp_path) -> g.FakeGemini:
    """Vertex AI with project/location and Application Default Credentials from a file (a still-valid token)."""
    _clear_env(monkeypatch)
    adc = tmp_path / "adc.json"
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "fake-client",
                "client_secret": "fake-secret",
                "refresh_token": "fake-refresh",
                "token": "fake-access-token",
                "expiry": "2099-01-01T00:00:00Z",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "true")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj-t")
    monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", "us-central1")
    monkeypatch.setenv("GOOGLE_VERTEX_BASE_URL", fake.base_url)
    return fake


def run(client: Any, agent: str, prompt: str = "hello") -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt=prompt)
    result = handle.wait(timeout=120)
    return result, list(handle.events())


def of_type(events: list[Any], kind: EventType) -> list[Any]:
    return [e for e in events if e.type == kind]


def model_turn(body: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in body["contents"] if c["role"] == "model")


# --------------------------------------------------------------------------- streaming, paths


def test_streamed_text_on_ai_studio(worker, client, studio):
    studio.enqueue(g.text_reply("Hello", " from", " Gemini", prompt=12, candidates=3))
    result, events = run(client, "gemini_t.chat", "say hello")

    assert result.status == TurnStatus.COMPLETED
    assert result.text == "Hello from Gemini"
    assert result.finish_reason == FinishReason.STOP
    deltas = [e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)]
    assert deltas == ["Hello", " from", " Gemini"]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 3)

    (request,) = studio.requests
    assert request.path == "/v1/models/gemini-test:streamGenerateContent?alt=sse"
    assert request.headers["x-goog-api-key"] == "<set>"
    body = request.body
    assert body["systemInstruction"]["parts"] == [{"text": "You are a test agent."}]
    assert body["contents"] == [{"role": "user", "parts": [{"text": "say hello"}]}]
    assert body["generationConfig"]["maxOutputTokens"] == 256
    assert body["generationConfig"]["temperature"] == 0.2
    names = [d["name"] for d in body["tools"][0]["functionDeclarations"]]
    assert "gemini_lookup" in names and "gemini_broken" in names
    assert API_KEY not in json.dumps([e.model_dump() for e in events])


def test_vertex_path_reaches_the_fake(worker, client, vertex):
    vertex.enqueue(g.text_reply("vertex", " says hi"))
    result, _ = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.COMPLETED and result.text == "vertex says hi"
    (request,) = vertex.requests
    assert request.path == (
        "/v1beta1/projects/proj-t/locations/us-central1/publishers/google/models/gemini-test:streamGenerateContent?alt=sse"
    )
    assert request.headers["authorization"] == "<set>"
    assert "x-goog-api-key" not in request.headers


# --------------------------------------------------------------------------- tools


def test_tool_round_trip_with_error_result_and_summed_usage(worker, client, studio):
    studio.enqueue(
        g.parts_reply(
            g.function_call("gemini_lookup", {"q": "x"}),
            g.function_call("gemini_broken", {"reason": "db"}),
            prompt=20,
            candidates=7,
            thoughts=3,
            cached=4,
        ),
        g.text_reply("done", prompt=40, candidates=2),
    )
    result, events = run(client, "gemini_t.chat", "look it up")

    assert result.status == TurnStatus.COMPLETED and result.text == "done"
    assert len(studio.requests) == 2
    second = studio.requests[1].body
    assert second["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "gemini_lookup", "args": {"q": "x"}}},
                {"functionCall": {"name": "gemini_broken", "args": {"reason": "db"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "gemini_lookup", "response": {"output": {"answer": "result for x"}}}},
                {
                    "functionResponse": {
                        "name": "gemini_broken",
                        "response": {"error": "RuntimeError: lookup backend down: db"},
                    }
                },
            ],
        },
    ]
    results = of_type(events, EventType.TOOL_RESULT)
    assert [(r.data["name"], r.data["is_error"]) for r in results] == [
        ("gemini_lookup", False),
        ("gemini_broken", True),
    ]
    finishes = [e.data["finish_reason"] for e in of_type(events, EventType.STEP_FINISH)]
    assert finishes == ["tool-calls", "stop"]
    usage = result.usage
    assert (usage.input_tokens, usage.output_tokens) == (60, 12)
    assert (usage.cache_read_tokens, usage.reasoning_tokens) == (4, 3)


def test_one_tool_call_per_step_runs_only_the_first_call(worker, client, studio):
    """parallel_tool_calls=False: Gemini's API has no switch for it, so the engine runs the first call and the
    model reads "not run" for the others (every call still gets its functionResponse)."""
    studio.enqueue(
        g.parts_reply(g.function_call("gemini_lookup", {"q": "x"}), g.function_call("gemini_lookup", {"q": "y"})),
        g.text_reply("done"),
    )
    result, events = run(client, "gemini_t.one_call", "look both up")

    assert result.status == TurnStatus.COMPLETED and result.text == "done"
    first, second = (r.body for r in studio.requests)
    assert "toolConfig" not in first  # nothing native to send: FunctionCallingConfig has no parallel switch
    assert model_turn(second)["parts"] == [
        {"functionCall": {"name": "gemini_lookup", "args": {"q": "x"}}},
        {"functionCall": {"name": "gemini_lookup", "args": {"q": "y"}}},
    ]
    assert second["contents"][-1]["parts"] == [
        {"functionResponse": {"name": "gemini_lookup", "response": {"output": {"answer": "result for x"}}}},
        {
            "functionResponse": {
                "name": "gemini_lookup",
                "response": {"error": "not run: one tool call per step (parallel_tool_calls=False); "
                             "call it again on its own"},
            }
        },
    ]  # fmt: skip
    statuses = [(r.data["is_error"], r.data["status"]) for r in of_type(events, EventType.TOOL_RESULT)]
    assert statuses == [(False, "ok"), (True, "denied")]


def test_failure_breaker_stops_a_tool_after_two_failures(worker, client, studio):
    call = g.function_call("gemini_broken", {"reason": "again"})
    studio.enqueue(g.parts_reply(call), g.parts_reply(call), g.parts_reply(call), g.text_reply("giving up"))
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.COMPLETED and result.text == "giving up"
    outputs = [e.data["output"] for e in of_type(events, EventType.TOOL_RESULT)]
    assert [o["status"] for o in outputs] == ["failed", "failed", "permanently_failed"]
    last_response = studio.requests[3].body["contents"][-1]["parts"][0]["functionResponse"]["response"]
    assert last_response["error"].startswith('TOOL_PERMANENTLY_FAILED: "gemini_broken" has failed 2 times')


def test_odd_tool_name_is_sanitized_and_mapped_back(worker, client, studio):
    sanitized = wire_name(ODD_TOOL)
    assert sanitized != ODD_TOOL and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}", sanitized)
    studio.enqueue(g.parts_reply(g.function_call(sanitized, {"order_id": "A1"})), g.text_reply("shipped"))
    result, events = run(client, "gemini_t.chat", "where is A1?")

    assert result.status == TurnStatus.COMPLETED and result.text == "shipped"
    declared = [d["name"] for d in studio.requests[0].body["tools"][0]["functionDeclarations"]]
    assert sanitized in declared and ODD_TOOL not in declared
    (tool_result,) = of_type(events, EventType.TOOL_RESULT)
    assert tool_result.data["name"] == ODD_TOOL
    assert tool_result.data["output"] == {"order": "A1", "status": "shipped"}
    second = studio.requests[1].body["contents"]
    assert second[1]["parts"][0]["functionCall"]["name"] == sanitized
    assert second[2]["parts"][0]["functionResponse"] == {
        "name": sanitized,
        "response": {"output": {"order": "A1", "status": "shipped"}},
    }


# --------------------------------------------------------------------------- reasoning


def test_reasoning_and_signatures_go_back_verbatim(worker, client, studio):
    call_sig = base64.b64encode(bytes([250, 251, 252, 253, 254, 255, 251, 255, 254])).decode()  # has '+' and '/'
    studio.enqueue(
        g.parts_reply(
            g.thought("Let me think"),
            g.thought(" harder"),
            g.text("Checking.", signature="dGV4dC1zaWc="),
            g.function_call("gemini_lookup", {"q": "y"}, signature=call_sig),
            g.text("", signature="ZW5kLXNpZw=="),
            thoughts=9,
        ),
        g.text_reply("final"),
    )
    result, events = run(client, "gemini_t.thinking", "think about y")

    assert result.status == TurnStatus.COMPLETED and result.text == "final"
    assert "".join(e.data["text"] for e in of_type(events, EventType.REASONING_DELTA)) == "Let me think harder"
    config = studio.requests[0].body["generationConfig"]["thinkingConfig"]
    assert config.get("includeThoughts", config.get("include_thoughts")) is True
    assert config.get("thinkingBudget", config.get("thinking_budget")) == 512

    parts = model_turn(studio.requests[1].body)["parts"]
    assert parts[0] == {"text": "Let me think harder", "thought": True}
    assert parts[1] == {"text": "Checking.", "thoughtSignature": "dGV4dC1zaWc="}
    assert parts[2]["functionCall"] == {"name": "gemini_lookup", "args": {"q": "y"}}
    assert base64.urlsafe_b64decode(parts[2]["thoughtSignature"]) == base64.b64decode(call_sig)
    assert parts[3] == {"text": "", "thoughtSignature": "ZW5kLXNpZw=="}
    assert len(parts) == 4
    assert result.usage.reasoning_tokens == 9


# --------------------------------------------------------------------------- retries and failures


def test_429_with_retry_after_is_retried_with_that_countdown(worker, client, studio):
    studio.enqueue(g.rate_limited(retry_after="1"), g.text_reply("ok after retry"))
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.COMPLETED and result.text == "ok after retry"
    (retry,) = of_type(events, EventType.STEP_RETRY)
    assert retry.data["countdown"] == 1.0
    assert retry.data["status"] == 429 and retry.data["code"] == "RESOURCE_EXHAUSTED"
    assert len(studio.requests) == 2


def test_error_event_first_in_a_200_stream_is_retried(worker, client, studio):
    studio.enqueue(
        g.SSEReply([g.error_event(503, "The model is overloaded. Please try again later.", "UNAVAILABLE")]),
        g.text_reply("recovered"),
    )
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.COMPLETED and result.text == "recovered"
    (retry,) = of_type(events, EventType.STEP_RETRY)
    assert retry.data["status"] == 503 and retry.data["code"] == "UNAVAILABLE"
    assert len(studio.requests) == 2


def test_error_after_content_fails_the_turn_without_retry(worker, client, studio):
    studio.enqueue(
        g.SSEReply(
            [g.chunk(g.text("partial ")), g.chunk(g.text("answer")), g.error_event(500, "Internal error", "INTERNAL")]
        ),
        g.text_reply("never sent"),
    )
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "") and "INTERNAL" in (result.error or "")
    assert "".join(e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)) == "partial answer"
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(studio.requests) == 1


def test_a_stream_that_ends_without_a_finish_reason_before_content_is_retried(worker, client, studio):
    # an empty stream, then one whose only chunk carries usage and no candidate: neither is an answer
    studio.enqueue(g.SSEReply([]), g.SSEReply([{"usageMetadata": g.usage()}]), g.text_reply("whole"))
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "whole" and result.finish_reason == FinishReason.STOP
    assert [r.data["code"] for r in of_type(events, EventType.STEP_RETRY)] == ["incomplete", "incomplete"]
    assert len(studio.requests) == 3


def test_a_stream_that_ends_without_a_finish_reason_after_content_fails_the_step(worker, client, studio):
    studio.enqueue(g.SSEReply([g.chunk(g.text("half an ")), g.chunk(g.text("answer"))]), g.text_reply("never sent"))
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.FAILED and result.finish_reason == FinishReason.ERROR
    assert "after content" in (result.error or "") and "without a finishReason" in (result.error or "")
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(studio.requests) == 1


def test_400_is_fatal_with_a_clear_message(worker, client, studio):
    studio.enqueue(g.ErrorReply(400, 'Invalid JSON payload received. Unknown name "foo"', "INVALID_ARGUMENT"))
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "400" in (result.error or "") and "Unknown name" in (result.error or "")
    assert "check the model name" in (result.error or "")
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(studio.requests) == 1


def test_invalid_api_key_names_the_variable_and_hides_the_key(worker, client, studio):
    studio.enqueue(
        g.ErrorReply(
            400,
            "API key not valid. Please pass a valid API key.",
            "INVALID_ARGUMENT",
            details=[{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}],
        )
    )
    result, events = run(client, "gemini_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "GOOGLE_API_KEY" in (result.error or "")
    assert API_KEY not in json.dumps([e.model_dump() for e in events])
    assert len(studio.requests) == 1


def test_stall_before_the_first_chunk_is_retried(worker, client, studio):
    studio.enqueue(g.SSEReply([], hold_after=0), g.text_reply("after the stall"))
    result, events = run(client, "gemini_t.stall")

    assert result.status == TurnStatus.COMPLETED and result.text == "after the stall"
    (retry,) = of_type(events, EventType.STEP_RETRY)
    assert retry.data["code"] == "stall"
    assert len(studio.requests) == 2


def test_cancel_is_noticed_while_the_upstream_is_silent(worker, client, studio):
    studio.enqueue(g.SSEReply([g.chunk(g.text("thinking out loud"))], hold_after=1))
    handle = client.submit("gemini_t.chat", prompt="go")
    for event in handle.events():
        if event.type == EventType.TEXT_DELTA:
            break
    handle.cancel()
    result = handle.wait(timeout=120)

    assert result.status == TurnStatus.CANCELLED
    assert result.text == "thinking out loud"
    assert len(studio.requests) == 1


# --------------------------------------------------------------------------- finish reasons, malformed calls


def test_finish_reasons_reach_the_turn(worker, client, studio):
    studio.enqueue(g.text_reply("cut", finish="MAX_TOKENS"))
    result, _ = run(client, "gemini_t.chat")
    assert result.finish_reason == FinishReason.LENGTH and result.text == "cut"

    studio.enqueue(g.text_reply("blocked", finish="SAFETY"))
    result, _ = run(client, "gemini_t.chat")
    assert result.finish_reason == FinishReason.CONTENT_FILTER


def test_malformed_function_call_is_retried_once_with_a_note(worker, client, studio):
    studio.enqueue(g.parts_reply(finish="MALFORMED_FUNCTION_CALL"), g.text_reply("recovered"))
    result, _ = run(client, "gemini_t.chat", "call something")

    assert result.status == TurnStatus.COMPLETED and result.text == "recovered"
    assert len(studio.requests) == 2
    assert studio.requests[1].body["contents"] == [
        {"role": "user", "parts": [{"text": "call something"}]},
        {"role": "user", "parts": [{"text": gemini.MALFORMED_NOTE}]},
    ]


def test_a_second_malformed_call_is_not_retried(worker, client, studio):
    studio.enqueue(g.parts_reply(finish="MALFORMED_FUNCTION_CALL"), g.parts_reply(finish="MALFORMED_FUNCTION_CALL"))
    result, _ = run(client, "gemini_t.chat")

    assert result.finish_reason == FinishReason.ERROR
    assert len(studio.requests) == 2


@pytest.mark.parametrize(
    ("raw", "calls", "expected"),
    [
        ("STOP", False, FinishReason.STOP),
        ("STOP", True, FinishReason.TOOL_CALLS),
        (None, False, FinishReason.STOP),
        (None, True, FinishReason.TOOL_CALLS),
        ("MAX_TOKENS", False, FinishReason.LENGTH),
        ("MAX_TOKENS", True, FinishReason.LENGTH),
        ("SAFETY", False, FinishReason.CONTENT_FILTER),
        ("RECITATION", False, FinishReason.CONTENT_FILTER),
        ("BLOCKLIST", False, FinishReason.CONTENT_FILTER),
        ("PROHIBITED_CONTENT", False, FinishReason.CONTENT_FILTER),
        ("SPII", False, FinishReason.CONTENT_FILTER),
        ("PROMPT_BLOCKED:OTHER", False, FinishReason.CONTENT_FILTER),
        ("MALFORMED_FUNCTION_CALL", False, FinishReason.ERROR),
        ("UNEXPECTED_TOOL_CALL", True, FinishReason.ERROR),
        ("OTHER", False, FinishReason.ERROR),
        ("SOMETHING_NEW", False, FinishReason.ERROR),
    ],
)
def test_finish_reason_table(raw, calls, expected):
    assert map_finish_reason(raw, calls) == expected


# --------------------------------------------------------------------------- classification, configuration


def test_retry_info_delay_is_used_when_there_is_no_header():
    err = genai_errors.ClientError(
        429,
        {
            "error": {
                "code": 429,
                "message": "quota",
                "status": "RESOURCE_EXHAUSTED",
                "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}],
            }
        },
    )
    classified = classify(err)
    assert classified.retryable and classified.retry_after_s == 37.0 and classified.status == 429


def test_context_length_error_is_fatal_and_says_what_to_do():
    err = genai_errors.ClientError(
        400,
        {
            "error": {
                "code": 400,
                "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
                "status": "INVALID_ARGUMENT",
            }
        },
    )
    classified = classify(err)
    assert not classified.retryable and classified.code == "context_length"
    assert "shorten" in classified.message


def test_check_configured_names_the_variables(monkeypatch):
    _clear_env(monkeypatch)
    with pytest.raises(SubmitError, match="GOOGLE_API_KEY"):
        gemini.check_configured()
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "true")
    with pytest.raises(SubmitError, match="GOOGLE_CLOUD_PROJECT"):
        gemini.check_configured()
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    gemini.check_configured()
    monkeypatch.delenv("GOOGLE_GENAI_USE_VERTEXAI")
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    gemini.check_configured()


# --------------------------------------------------------------------------- names and schemas


def test_wire_names_follow_googles_rules_and_are_stable():
    pattern = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
    for name in ["search_docs", "9lives", "a b", "a_b", "ü-tool", "x" * 100, "ns:tool", "-dash"]:
        wired = wire_name(name)
        assert pattern.fullmatch(wired), (name, wired)
        assert wire_name(name) == wired
    assert wire_name("search_docs") == "search_docs"
    assert wire_name("9lives").startswith("_9lives_")
    assert wire_name("a b") != wire_name("a_b") == "a_b"
    assert wire_name("x" * 100) != wire_name("x" * 101)


class _Inner(BaseModel):
    name: str
    size: int | None = None


class _Args(BaseModel):
    items: list[_Inner]
    mode: str = "fast"
    limit: int | None = None


def test_pydantic_schema_is_converted():
    params = convert_parameters(_Args.model_json_schema())
    assert params == {
        "type": "OBJECT",
        "properties": {
            "items": {
                "type": "ARRAY",
                "items": {
                    "type": "OBJECT",
                    "properties": {"name": {"type": "STRING"}, "size": {"type": "INTEGER", "nullable": True}},
                    "required": ["name"],
                },
            },
            "mode": {"type": "STRING", "default": "fast"},
            "limit": {"type": "INTEGER", "nullable": True},
        },
        "required": ["items"],
    }


def test_schema_conversions_and_refusals():
    schema = {
        "type": "object",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "additionalProperties": False,
        "properties": {
            "level": {"type": "integer", "enum": [1, 2, 3], "description": "how deep"},
            "kind": {"enum": ["a", "b"]},
            "when": {"type": ["string", "null"], "format": "date-time"},
            "email": {"type": "string", "format": "email"},
        },
    }
    params = convert_parameters(schema)
    assert params is not None
    props = params["properties"]
    assert props["level"] == {"type": "INTEGER", "description": "how deep (allowed values: 1, 2, 3)"}
    assert props["kind"] == {"type": "STRING", "enum": ["a", "b"], "format": "enum"}
    assert props["when"] == {"type": "STRING", "format": "date-time", "nullable": True}
    assert props["email"] == {"type": "STRING"}
    assert convert_parameters({"type": "object", "properties": {}}) is None

    def spec(schema: dict[str, Any]) -> ToolSpec:
        return ToolSpec(name="gemini_x", description="x", input_schema=schema)

    recursive = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/Node"}},
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
    }
    with pytest.raises(DefinitionError, match="recursive"):
        check_tools([spec(recursive)])
    with pytest.raises(DefinitionError, match="free-form object"):
        check_tools([spec({"type": "object", "properties": {"meta": {"type": "object"}}})])
    with pytest.raises(DefinitionError, match="items"):
        check_tools([spec({"type": "object", "properties": {"tags": {"type": "array"}}})])
    with pytest.raises(DefinitionError, match="no type"):
        check_tools([spec({"type": "object", "properties": {"anything": {}}})])
    check_tools([spec({"type": "object", "properties": {"q": {"type": "string"}}})])


def test_turn_result_messages_round_trip_with_tool_cycle_and_thoughts(worker, client, studio):
    """Turn 1's TurnResult.messages, submitted as turn 2, reach Gemini with the cycle in its own shape."""
    studio.enqueue(
        g.parts_reply(
            g.thought("Let me think"),
            g.text("Checking.", signature="dGV4dC1zaWc="),
            g.function_call("gemini_lookup", {"q": "y"}, signature="Y2FsbC1zaWc="),
        ),
        g.text_reply("final"),
        g.text_reply("second"),
    )
    first, _ = run(client, "gemini_t.thinking", "think about y")
    assert first.status == TurnStatus.COMPLETED, first.error
    messages = [m.model_dump(mode="json") for m in first.messages] + [{"role": "user", "content": "again"}]
    second = client.submit("gemini_t.thinking", messages=messages).wait(timeout=120)
    assert second.status == TurnStatus.COMPLETED and second.text == "second"

    turn1_step2, turn2 = studio.requests[1].body, studio.requests[2].body
    assert turn2["contents"][:3] == turn1_step2["contents"][:3]  # exactly what turn 1 itself sent back
    model = turn2["contents"][1]
    assert model["role"] == "model"
    assert model["parts"][0] == {"text": "Let me think", "thought": True}
    assert model["parts"][2]["functionCall"] == {"name": "gemini_lookup", "args": {"q": "y"}}
    assert base64.urlsafe_b64decode(model["parts"][2]["thoughtSignature"]) == b"call-sig"
    response = turn2["contents"][2]["parts"][0]["functionResponse"]
    assert response["name"] == "gemini_lookup"
    assert [c["role"] for c in turn2["contents"]] == ["user", "model", "user", "model", "user"]
    assert turn2["contents"][4]["parts"] == [{"text": "again"}]


def test_a_function_call_arrives_whole_with_no_tool_input_deltas(worker, client, studio):
    """The Gemini API sends each function call whole (partial arguments are a Vertex-only option stepq does not
    set): no tool-input-delta events, and the turn's call and result end as before."""
    studio.enqueue(g.parts_reply(g.function_call("gemini_lookup", {"q": "whole"})), g.text_reply("done"))
    result, events = run(client, "gemini_t.chat", "look it up")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert of_type(events, EventType.TOOL_INPUT_DELTA) == []
    [call] = of_type(events, EventType.TOOL_CALL)
    assert call.data["args"] == {"q": "whole"}
    assert len(of_type(events, EventType.TOOL_RESULT)) == 1 and result.text == "done"
