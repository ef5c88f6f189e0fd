"""The `anthropic` adapter: the unmodified SDK against a local fake Messages API, driven through full
stepq turns (client.submit -> in-process Celery worker on real Redis -> events -> wait)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from stepq.config.settings import Settings
from stepq.errors import DefinitionError, SubmitError
from stepq.models import (
    AssistantMessage,
    EventType,
    FinishReason,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    TurnStatus,
    UserMessage,
)
from stepq.producer.gateway.ui_stream import UIMessageTranslator
from stepq.providers.anthropic import adapter as anthropic_provider
from stepq.providers.anthropic import vertex as anthropic_vertex
from stepq.providers.anthropic.stream import map_finish_reason
from stepq.providers.anthropic.wire import build_params, check_tools, tool_result_content
from stepq.providers.base import ProviderError, StepRequest
from stepq.providers.registry import register_provider
from tests.conftest import make_settings
from tests.fakes.anthropic_server import (
    ErrorReply,
    FakeAnthropic,
    SSEReply,
    error_event,
    message_start,
    redacted_thinking_block,
    stream,
    text_block,
    text_reply,
    thinking_block,
    tool_use_block,
)

API_KEY = "sk-ant-test-0123456789abcdef"
WAIT = 120  # generous: a turn on a loaded 2-core machine took over 30 s


@pytest.fixture
def settings(prefix: str) -> Settings:
    """No delta coalescing: every streamed chunk is its own text-delta event."""
    return make_settings(prefix, coalesce_window_ms=0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("ANTHROPIC_PROFILE", raising=False)
    yield server
    server.stop()


def run(client: Any, agent: str, prompt: str = "hi", **kwargs: Any) -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt=prompt, **kwargs)
    result = handle.wait(timeout=WAIT)
    return result, list(handle.events())


def of_type(events: list[Any], kind: EventType) -> list[Any]:
    return [e for e in events if e.type == kind]


def markers(body: dict[str, Any]) -> int:
    blocks = [*body.get("system", []), *body.get("tools", []), *(b for m in body["messages"] for b in m["content"])]
    return sum(1 for b in blocks if "cache_control" in b)


# --------------------------------------------------------------------------- streaming and tools


def test_streamed_text_arrives_as_several_deltas(worker, client, fake):
    fake.enqueue(text_reply("Hel", "lo ", "wor", "ld", input_tokens=12, output_tokens=4))
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "Hello world"
    assert result.finish_reason == FinishReason.STOP
    assert [e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)] == ["Hel", "lo ", "wor", "ld"]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 4)

    [request] = fake.wait_for_requests(1)
    assert request.path == "/v1/messages"
    assert request.headers["authorization"] == "<present>"
    body = request.body
    assert body["model"] == "claude-test" and body["stream"] is True and body["max_tokens"] == 8192
    assert body["system"] == [
        {"type": "text", "text": "You are a terse test assistant.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    ]
    assert [t["name"] for t in body["tools"]] == ["anthropic_lookup", "anthropic_fail"]
    assert body["tools"][0]["input_schema"]["properties"]["query"]["type"] == "string"
    assert "cache_control" not in body["tools"][0] and body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "tool_choice" not in body and "thinking" not in body


def test_tool_round_trip_sends_results_and_errors_in_anthropic_shape(worker, client, fake):
    fake.enqueue(
        stream(
            text_block(0, ["Let me look."]),
            tool_use_block(1, "toolu_1", "anthropic_lookup", ['{"que', 'ry": "x"}']),
            tool_use_block(2, "toolu_2", "anthropic_fail", ['{"reason": "boom"}']),
            stop_reason="tool_use",
            input_tokens=10,
            output_tokens=6,
            cache_write=100,
        ),
        text_reply("done", input_tokens=20, output_tokens=3, cache_read=100),
    )
    result, events = run(client, "anthropic_t.chat", prompt="find x")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "done"
    # usage summed across both steps (input + output of each: 10+6+20+3 = 39)
    assert result.usage.total_tokens == 39
    assert (result.usage.cache_write_tokens, result.usage.cache_read_tokens) == (100, 100)
    assert [s.raw_stop_reason for s in result.trace.steps] == ["tool_use", "end_turn"]
    assert [s.stop_reason for s in result.trace.steps] == ["tool-calls", "stop"]
    calls = of_type(events, EventType.TOOL_CALL)
    assert [(c.data["id"], c.data["args"]) for c in calls] == [
        ("toolu_1", {"query": "x"}),
        ("toolu_2", {"reason": "boom"}),
    ]

    requests = fake.wait_for_requests(2)
    assert len(requests) == 2
    second = requests[1].body
    user, assistant, results = second["messages"]
    assert user["content"][0]["text"] == "find x"
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "anthropic_lookup", "input": {"query": "x"}},
            {"type": "tool_use", "id": "toolu_2", "name": "anthropic_fail", "input": {"reason": "boom"}},
        ],
    }
    assert results["role"] == "user"
    ok, failed = results["content"]
    assert ok["type"] == "tool_result" and ok["tool_use_id"] == "toolu_1" and ok["is_error"] is False
    assert json.loads(ok["content"]) == {"answer": "result for x"}
    assert failed == {
        "type": "tool_result",
        "tool_use_id": "toolu_2",
        "content": "Error executing tool anthropic_fail: RuntimeError: boom",
        "is_error": True,
        "cache_control": {"type": "ephemeral"},
    }
    # system + last tool + the two latest user turns: the four-marker cap
    assert markers(second) == 4
    assert "cache_control" in user["content"][-1]


def test_one_tool_call_per_step_is_asked_of_the_api(worker, client, fake):
    """parallel_tool_calls=False on the agent goes out as Anthropic's own switch."""
    fake.enqueue(text_reply("ok"))
    result, _ = run(client, "anthropic_t.one_call")

    assert result.status == TurnStatus.COMPLETED, result.error
    [request] = fake.requests
    assert request.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_thinking_blocks_go_back_verbatim_with_signatures(worker, client, fake):
    fake.enqueue(
        stream(
            thinking_block(0, ["Think", "ing..."], "sig-abc"),
            redacted_thinking_block(1, "opaque-data"),
            tool_use_block(2, "toolu_9", "anthropic_lookup", ['{"query": "y"}']),
            stop_reason="tool_use",
            output_tokens=20,
            thinking_tokens=7,
        ),
        stream(thinking_block(0, ["ok"], "sig-2"), text_block(1, ["answer"])),
    )
    result, events = run(client, "anthropic_t.thinking")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "answer"
    assert [e.data["text"] for e in of_type(events, EventType.REASONING_DELTA)] == ["Think", "ing...", "ok"]
    assert result.trace.steps[0].usage.reasoning_tokens == 7

    first, second = (r.body for r in fake.wait_for_requests(2))
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] > 2048
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Thinking...", "signature": "sig-abc"},
            {"type": "redacted_thinking", "data": "opaque-data"},
            {"type": "tool_use", "id": "toolu_9", "name": "anthropic_lookup", "input": {"query": "y"}},
        ],
    }


def test_unparseable_tool_input_gets_one_corrective_retry(worker, client, fake):
    fake.enqueue(
        stream(tool_use_block(0, "toolu_bad", "anthropic_lookup", ['{"query": ']), stop_reason="tool_use"),
        text_reply("recovered"),
    )
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "recovered"
    assert not of_type(events, EventType.TOOL_CALL)
    second = fake.wait_for_requests(2)[1].body
    [turn] = second["messages"]  # the malformed call is dropped; the note joins the user turn
    assert turn["role"] == "user"
    assert turn["content"][0]["text"] == "hi" and "malformed" in turn["content"][1]["text"]


def test_max_tokens_maps_to_length(worker, client, fake):
    fake.enqueue(text_reply("cut sh", stop_reason="max_tokens"))
    result, _ = run(client, "anthropic_t.chat")
    assert result.status == TurnStatus.COMPLETED
    assert result.finish_reason == FinishReason.LENGTH
    assert result.trace.steps[0].raw_stop_reason == "max_tokens"


# --------------------------------------------------------------------------- failures and retries


def test_429_retry_after_is_the_countdown(worker, client, fake):
    fake.enqueue(ErrorReply(429, "rate_limit_error", "slow down", {"retry-after": "1"}), text_reply("ok"))
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "ok"
    [retry] = of_type(events, EventType.STEP_RETRY)
    assert retry.data["countdown"] == 1.0 and retry.data["retry_after"] == 1.0
    assert retry.data["status"] == 429 and retry.data["code"] == "rate_limit_error"
    assert len(fake.wait_for_requests(2)) == 2


def test_error_event_before_content_is_retried(worker, client, fake):
    fake.enqueue(SSEReply([message_start(), error_event("overloaded_error", "Overloaded")]), text_reply("fine"))
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "fine"
    [retry] = of_type(events, EventType.STEP_RETRY)
    assert retry.data["code"] == "overloaded_error"
    types = [e.type for e in events]
    assert EventType.TEXT_DELTA not in types[: types.index(EventType.STEP_RETRY)]
    assert len(fake.requests) == 2


def test_error_event_after_content_fails_without_retry(worker, client, fake):
    partial = text_block(0, ["partial ", "answer"])[:3]  # start + two deltas, no stop
    fake.enqueue(
        SSEReply([message_start(), *partial, error_event("overloaded_error", "Overloaded")]),
        text_reply("must not be requested"),
    )
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "") and "overloaded_error" in (result.error or "")
    assert [e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)] == ["partial ", "answer"]
    assert result.text == "partial answer"
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(fake.requests) == 1


def test_400_is_fatal_with_a_clear_message(worker, client, fake):
    fake.enqueue(ErrorReply(400, "invalid_request_error", "max_tokens: too large"), text_reply("unused"))
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.FAILED
    error = result.error or ""
    assert "400" in error and "invalid_request_error" in error and "max_tokens: too large" in error
    assert "check the model name" in error
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(fake.requests) == 1


def test_401_names_the_variable_and_never_the_key(worker, client, fake):
    fake.enqueue(ErrorReply(401, "authentication_error", "invalid x-api-key"))
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "ANTHROPIC_API_KEY" in (result.error or "")
    assert API_KEY not in json.dumps([e.model_dump(mode="json") for e in events])
    assert len(fake.requests) == 1


def test_stalled_stream_is_retried(worker, client, fake):
    held = SSEReply(text_reply("never").events, hold_after=2)  # message_start + ping, then silence
    fake.enqueue(held, text_reply("after the stall"))
    result, events = run(client, "anthropic_t.stall")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "after the stall"
    [retry] = of_type(events, EventType.STEP_RETRY)
    assert retry.data["code"] == "stall"


def test_stream_cut_before_message_stop_is_retried(worker, client, fake):
    fake.enqueue(SSEReply(text_reply("x").events, close_after=2), text_reply("complete"))
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "complete"
    assert [r.data["code"] for r in of_type(events, EventType.STEP_RETRY)] == ["incomplete"]


def test_stream_that_ends_cleanly_without_message_stop_after_content_fails_the_step(worker, client, fake):
    whole = text_reply("half an answer").events
    assert whole[-1]["type"] == "message_stop"
    fake.enqueue(SSEReply(whole[:-1]), text_reply("never sent"))  # message_delta (stop_reason) and then the end
    result, events = run(client, "anthropic_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "") and "message_stop" in (result.error or "")
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(fake.requests) == 1


def test_cancel_mid_stream_ends_the_turn_cancelled(worker, client, fake):
    # start + ping + block start + first delta, then the upstream goes silent
    fake.enqueue(SSEReply(text_reply("first ", "second").events, hold_after=4), text_reply("unused"))
    handle = client.submit("anthropic_t.stall", prompt="hi")
    for event in handle.events():
        if event.type == EventType.TEXT_DELTA:
            handle.cancel()
            break
    result = handle.wait(timeout=WAIT)

    assert result.status == TurnStatus.CANCELLED, result.error
    assert result.finish_reason == FinishReason.CANCELLED
    assert not of_type(list(handle.events()), EventType.STEP_RETRY)
    assert len(fake.requests) == 1


# --------------------------------------------------------------------------- model resolution


def test_provider_model_shorthand_on_an_overridable_agent(worker, client, fake):
    fake.enqueue(text_reply("from claude"))
    handle = client.submit("anthropic_t.override", prompt="hi", model="anthropic/claude-x")
    state = handle.get()
    assert (state.provider, state.model) == ("anthropic", "claude-x")
    result = handle.wait(timeout=WAIT)
    assert result.text == "from claude"
    assert fake.wait_for_requests(1)[0].body["model"] == "claude-x"

    # without the override the same agent stays on its scripted default
    scripted = client.submit("anthropic_t.override", prompt="hi").wait(timeout=WAIT)
    assert scripted.text == "scripted answer"
    assert len(fake.requests) == 1


def test_agent_default_provider_and_shorthand_default_model(worker, client, fake):
    fake.enqueue(text_reply("a"), text_reply("b"))
    assert client.submit("anthropic_t.chat", prompt="hi").wait(timeout=WAIT).text == "a"
    assert client.submit("anthropic_t.no_cache", prompt="hi").wait(timeout=WAIT).text == "b"
    first, second = (r.body for r in fake.wait_for_requests(2))
    assert first["model"] == "claude-test"
    assert second["model"] == "claude-shorthand"
    assert markers(second) == 0  # provider_options={"cache": False}


def test_environment_provider_and_model(worker, fake, prefix):
    from stepq.producer.client import Client

    fake.enqueue(text_reply("env one"), text_reply("env two"))
    explicit = Client(make_settings(prefix, provider="anthropic", model="claude-env"))
    handle = explicit.submit("anthropic_t.from_env", prompt="hi")
    assert (handle.get().provider, handle.get().model) == ("anthropic", "claude-env")
    assert handle.wait(timeout=WAIT).text == "env one"

    shorthand = Client(make_settings(prefix, model="anthropic/claude-env-2"))
    assert shorthand.submit("anthropic_t.from_env", prompt="hi").wait(timeout=WAIT).text == "env two"
    assert [r.body["model"] for r in fake.wait_for_requests(2)] == ["claude-env", "claude-env-2"]


def test_unconfigured_provider_fails_at_submit(client, fake, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(SubmitError, match="ANTHROPIC_API_KEY"):
        client.submit("anthropic_t.chat", prompt="hi")
    with pytest.raises(SubmitError, match="ANTHROPIC_API_KEY"):
        client.submit("anthropic_t.override", prompt="hi", model="anthropic/claude-x")
    assert fake.requests == []


# --------------------------------------------------------------------------- Claude on Vertex AI


@pytest.fixture
def vertex(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> FakeAnthropic:
    register_provider("anthropic-vertex", anthropic_vertex.create_adapter, anthropic_vertex.check_configured)
    # a throwaway service-account key whose token_uri is the fake's OAuth endpoint
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    adc = tmp_path / "adc.json"
    adc.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "proj-test",
                "private_key_id": "fake-key-id",
                "private_key": pem.decode(),
                "client_email": "stepq-test@proj-test.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"{fake.base_url}/token",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("CLOUD_ML_REGION", "us-east5")
    monkeypatch.setenv("ANTHROPIC_VERTEX_PROJECT_ID", "proj-test")
    monkeypatch.setenv("ANTHROPIC_VERTEX_BASE_URL", f"{fake.base_url}/v1")
    return fake


def test_claude_on_vertex_streams_and_round_trips_tools(worker, client, vertex):
    vertex.enqueue(
        stream(tool_use_block(0, "toolu_v", "anthropic_lookup", ['{"query": "v"}']), stop_reason="tool_use"),
        text_reply("vertex ", "done"),
    )
    result, events = run(client, "anthropic_t.vertex")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "vertex done"
    assert [e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)] == ["vertex ", "done"]
    calls = [r for r in vertex.requests if r.path != "/token"]
    assert len(calls) == 2
    assert {r.path for r in calls} == {
        "/v1/projects/proj-test/locations/us-east5/publishers/anthropic/models/claude-v:streamRawPredict"
    }
    assert all(r.headers["authorization"] == "<present>" for r in calls)
    first, second = (r.body for r in calls)
    assert "model" not in first and first["anthropic_version"] and first["stream"] is True
    assert second["messages"][2]["content"][0]["tool_use_id"] == "toolu_v"
    assert any(r.path == "/token" for r in vertex.requests)


def test_vertex_needs_region_and_project(client, vertex, monkeypatch):
    monkeypatch.delenv("CLOUD_ML_REGION")
    with pytest.raises(SubmitError, match="CLOUD_ML_REGION"):
        client.submit("anthropic_t.vertex", prompt="hi")
    assert vertex.requests == []


# --------------------------------------------------------------------------- unit: mapping tables and wire shape


@pytest.mark.parametrize(
    ("raw", "had_tools", "expected"),
    [
        ("end_turn", False, FinishReason.STOP),
        ("stop_sequence", False, FinishReason.STOP),
        ("max_tokens", False, FinishReason.LENGTH),
        ("model_context_window_exceeded", False, FinishReason.LENGTH),
        ("tool_use", True, FinishReason.TOOL_CALLS),
        ("refusal", False, FinishReason.CONTENT_FILTER),
        ("pause_turn", False, FinishReason.STOP),
        (None, False, FinishReason.STOP),
        (None, True, FinishReason.TOOL_CALLS),
        ("something_new", False, FinishReason.STOP),
    ],
)
def test_finish_reason_table(raw, had_tools, expected):
    assert map_finish_reason(raw, had_tools) == expected


def _request(**kwargs: Any) -> StepRequest:
    values: dict[str, Any] = {
        "provider": "anthropic",
        "model": "m",
        "messages": [UserMessage(content="q")],
        "tools": [ToolSpec(name="a", description="A", input_schema={"type": "object", "properties": {}})],
    }
    values.update(kwargs)
    return StepRequest(**values)


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("a", {"type": "tool", "name": "a"}),
        (None, None),
    ],
)
def test_tool_choice_mapping(choice, wire):
    assert build_params(_request(tool_choice=choice)).get("tool_choice") == wire


def test_tool_choice_naming_an_unknown_tool_is_fatal():
    with pytest.raises(ProviderError) as info:
        build_params(_request(tool_choice="nope"))
    assert not info.value.retryable and "nope" in info.value.message


def test_transcript_merges_turns_and_drops_foreign_reasoning():
    messages = [
        UserMessage(content="q"),
        AssistantMessage(
            parts=[
                ReasoningPart(text="gemini thought", signature="g", provider="gemini"),
                ReasoningPart(text="unsigned", provider="anthropic"),
                TextPart(text=""),
                ToolCall(id="t1", name="a", args={"k": 1}),
            ]
        ),
        ToolResultMessage(results=[ToolResult(tool_call_id="t1", name="a", output="plain")]),
        UserMessage(content="note after the results"),
    ]
    params = build_params(_request(messages=messages, system="sys", options={"cache": False}))
    assert params["messages"][1]["content"] == [{"type": "tool_use", "id": "t1", "name": "a", "input": {"k": 1}}]
    assert params["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "plain", "is_error": False},
            {"type": "text", "text": "note after the results"},
        ],
    }
    assert params["system"] == [{"type": "text", "text": "sys"}]
    assert "temperature" not in params and "tools" in params


def test_cache_markers_never_exceed_four():
    messages: list[Any] = []
    for i in range(5):
        messages += [UserMessage(content=f"u{i}"), AssistantMessage(parts=[TextPart(text=f"a{i}")])]
    messages.append(UserMessage(content="last"))
    params = build_params(_request(messages=messages, system="sys", options={"cache_ttl": "1h"}))
    marked = [b for m in params["messages"] for b in m["content"] if "cache_control" in b]
    assert [b["text"] for b in marked] == ["u4", "last"]
    assert marked[0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert markers(params) == 4


def test_thinking_budget_must_leave_room_for_the_answer():
    with pytest.raises(ProviderError, match="thinking_budget"):
        build_params(_request(max_tokens=1000, options={"thinking_budget": 2048}))
    params = build_params(_request(max_tokens=4000, options={"thinking_budget": 2048}))
    assert params["thinking"] == {"type": "enabled", "budget_tokens": 2048} and params["max_tokens"] == 4000


def test_tool_result_content_shapes():
    assert tool_result_content(ToolResult(tool_call_id="1", name="t", output={"a": 1})) == '{"a": 1}'
    denied = ToolResult(tool_call_id="1", name="t", output={"error": "denied", "status": "denied"}, is_error=True)
    assert tool_result_content(denied) == "Error executing tool t: denied"


def test_check_tools_rejects_what_anthropic_cannot_declare():
    check_tools([ToolSpec(name="ok_name-1", description="d", input_schema={"properties": {}})])
    with pytest.raises(DefinitionError, match="must match"):
        check_tools([ToolSpec(name="has.dot", description="d", input_schema={})])
    with pytest.raises(DefinitionError, match="root is a JSON object"):
        check_tools([ToolSpec(name="arr", description="d", input_schema={"type": "array"})])
    with pytest.raises(DefinitionError, match="twice"):
        spec = ToolSpec(name="dup", description="d", input_schema={})
        check_tools([spec, spec])


def test_check_configured_accepts_a_bearer_token(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_PROFILE", raising=False)
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "token-value")
    anthropic_provider.check_configured()
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN")
    with pytest.raises(SubmitError) as info:
        anthropic_provider.check_configured()
    assert "ANTHROPIC_API_KEY" in str(info.value)


def test_turn_result_messages_round_trip_with_tool_cycle_and_thinking(worker, client, fake):
    """Turn 1's TurnResult.messages, submitted as turn 2, reach Anthropic with the cycle in its own shape."""
    fake.enqueue(
        stream(
            thinking_block(0, ["Think", "ing..."], "sig-abc"),
            tool_use_block(1, "toolu_9", "anthropic_lookup", ['{"query": "y"}']),
            stop_reason="tool_use",
        ),
        stream(thinking_block(0, ["ok"], "sig-2"), text_block(1, ["answer"])),
        text_reply("second answer"),
    )
    first, _ = run(client, "anthropic_t.thinking")
    assert first.status == TurnStatus.COMPLETED, first.error
    messages = [m.model_dump(mode="json") for m in first.messages] + [{"role": "user", "content": "again"}]
    second = client.submit("anthropic_t.thinking", messages=messages).wait(timeout=WAIT)
    assert second.status == TurnStatus.COMPLETED and second.text == "second answer"

    turn1_step2, turn2 = (r.body for r in fake.wait_for_requests(3)[1:])

    def bare(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:  # cache markers move with the latest turns
        return [
            {**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
            for m in messages
        ]

    assert bare(turn2["messages"][:3]) == bare(turn1_step2["messages"][:3])  # exactly what turn 1 itself sent back
    assert turn2["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Thinking...", "signature": "sig-abc"},
        {"type": "tool_use", "id": "toolu_9", "name": "anthropic_lookup", "input": {"query": "y"}},
    ]
    [tool_result] = [b for b in turn2["messages"][2]["content"] if b["type"] == "tool_result"]
    assert tool_result["tool_use_id"] == "toolu_9" and "result for y" in json.dumps(tool_result["content"])
    assert turn2["messages"][3]["role"] == "assistant"
    assert {"type": "thinking", "thinking": "ok", "signature": "sig-2"} in turn2["messages"][3]["content"]
    assert [b.get("text") for b in turn2["messages"][4]["content"]] == ["again"]


# --------------------------------------------------------------------------- tool-input streaming


def _tool_inputs(events: list[Any]) -> dict[str, str]:
    joined: dict[str, str] = {}
    for e in of_type(events, EventType.TOOL_INPUT_DELTA):
        joined[e.data["id"]] = joined.get(e.data["id"], "") + e.data["text"]
    return joined


def test_tool_input_streams_as_deltas_that_join_to_the_calls_arguments(worker, client, fake):
    pieces = ['{"que', 'ry": "a long', ' argument"}']
    fake.enqueue(
        stream(tool_use_block(0, "toolu_s", "anthropic_lookup", pieces), stop_reason="tool_use"),
        text_reply("done"),
    )
    result, events = run(client, "anthropic_t.chat", prompt="find")
    assert result.status == TurnStatus.COMPLETED, result.error
    deltas = of_type(events, EventType.TOOL_INPUT_DELTA)
    assert [(d.data["id"], d.data["name"], d.data["text"]) for d in deltas] == [
        ("toolu_s", "anthropic_lookup", p) for p in pieces
    ]  # window 0: one event per piece, every one naming its call and tool
    [call] = of_type(events, EventType.TOOL_CALL)
    assert json.loads(_tool_inputs(events)["toolu_s"]) == call.data["args"] == {"query": "a long argument"}
    assert max(d.seq for d in deltas) < call.seq  # the input streams before the call is final


def test_a_stream_broken_after_partial_tool_input_retries_with_a_reset(worker, client, fake):
    """Tool input is not answer content: the step retries as before, and the reset drops the partial call."""
    broken = stream(tool_use_block(0, "toolu_r", "anthropic_lookup", ['{"query', '": "x"}']), stop_reason="tool_use")
    fake.enqueue(
        SSEReply(broken.events, close_after=4),  # message_start, ping, block start, one input piece, then cut
        stream(tool_use_block(0, "toolu_r", "anthropic_lookup", ['{"query": "x"}']), stop_reason="tool_use"),
        text_reply("done"),
    )
    result, events = run(client, "anthropic_t.chat", prompt="find")
    assert result.status == TurnStatus.COMPLETED, result.error
    kinds = [e.type for e in events]
    first_piece, reset = kinds.index(EventType.TOOL_INPUT_DELTA), kinds.index(EventType.STEP_RESET)
    assert first_piece < reset < kinds.index(EventType.TOOL_CALL)
    assert of_type(events, EventType.TOOL_INPUT_DELTA)[0].data["text"] == '{"query'

    translator = UIMessageTranslator(result.turn_id)
    chunks = [c for e in events for c in translator.feed(e)]
    tool_chunks = [c["type"] for c in chunks if c["type"].startswith("tool-input") or c["type"] == "reset-step"]
    assert tool_chunks == [
        "tool-input-start",
        "tool-input-delta",
        "reset-step",
        "tool-input-start",  # the retried attempt reopens the call in a fresh part
        "tool-input-delta",
        "tool-input-available",
    ]


def test_an_unknown_tools_input_streams_and_the_call_is_refused_as_before(worker, client, fake):
    """The tool-call event shows a call's arguments whatever its tool, so streaming them shows nothing more;
    the call itself is refused (an error result the model reads), and no tool runs."""
    fake.enqueue(
        stream(tool_use_block(0, "toolu_u", "not_a_tool", ['{"path"', ': "/etc"}']), stop_reason="tool_use"),
        text_reply("sorry"),
    )
    result, events = run(client, "anthropic_t.chat", prompt="find")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert _tool_inputs(events) == {"toolu_u": '{"path": "/etc"}'}
    [tool_result] = of_type(events, EventType.TOOL_RESULT)
    assert tool_result.data["is_error"] and "not_a_tool" in json.dumps(tool_result.data["output"])
