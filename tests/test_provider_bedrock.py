"""The Bedrock adapter: the unmodified boto3 against a local server speaking AWS event-stream framing,
driven through full stepq turns (client.submit -> in-process Celery worker -> events -> wait)."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from typing import Any, cast

import pytest
from botocore.eventstream import EventStreamBuffer

from stepq.config.settings import Settings
from stepq.errors import DefinitionError, SubmitError
from stepq.models import (
    AssistantMessage,
    Event,
    EventType,
    FinishReason,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    TurnResult,
    TurnStatus,
    UserMessage,
)
from stepq.providers.base import ProviderError, StepRequest
from stepq.providers.bedrock import adapter as bedrock
from stepq.providers.bedrock import wire as bedrock_wire
from tests.agents_bedrock import BEDROCK_MODEL
from tests.conftest import make_settings
from tests.fakes.bedrock_server import (
    ErrorReply,
    FakeBedrock,
    Stall,
    StreamReply,
    event,
    exception,
    message_start,
    metadata,
    reasoning_block,
    redacted_block,
    text_block,
    tool_block,
    turn,
)

SECRET = "fake-secret-do-not-print"
_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_BEARER_TOKEN_BEDROCK",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
)


def _isolate_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may come from ~/.aws, instance metadata or the caller's AWS environment."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/stepq-test/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/stepq-test/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, coalesce_window_ms=0.0)  # one text-delta event per streamed delta


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBedrock]:
    server = FakeBedrock()
    _isolate_aws(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.url)
    yield server
    server.close()


def run(client: Any, agent: str, prompt: str = "hi") -> tuple[TurnResult, list[Event]]:
    handle = client.submit(agent, prompt=prompt)
    result = handle.wait(timeout=120)
    return result, list(handle.events())


def of(events: list[Event], kind: EventType) -> list[Event]:
    return [e for e in events if e.type == kind]


# --------------------------------------------------------------------------- full turns


def test_streamed_text_through_a_turn(fake: FakeBedrock, worker: Any, client: Any) -> None:
    fake.add(turn(text_block(0, ["Hel", "lo ", "wor", "ld"]), usage=(12, 4)))
    result, events = run(client, "bedrock_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "Hello world"
    assert result.finish_reason == FinishReason.STOP
    assert [e.data["text"] for e in of(events, EventType.TEXT_DELTA)] == ["Hel", "lo ", "wor", "ld"]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 4)
    assert result.usage.cache_read_tokens is None

    [request] = fake.requests
    assert request.model_id == BEDROCK_MODEL
    assert "%3A0/converse-stream" in request.path  # the SDK URL-encoded the model id
    assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256")  # signed with the env credentials
    assert request.body["system"] == [{"text": "You are terse."}]
    assert request.body["messages"] == [{"role": "user", "content": [{"text": "hi"}]}]
    assert request.body["inferenceConfig"] == {"maxTokens": 256, "temperature": 0.2, "stopSequences": ["END"]}
    assert "toolConfig" not in request.body


def test_tool_round_trip_with_error_result_and_summed_usage(fake: FakeBedrock, worker: Any, client: Any) -> None:
    fake.add(
        turn(
            text_block(0, ["Let me ", "check."]),
            tool_block(1, "tu_lookup", "bedrock_lookup", {"key": "alpha"}),
            tool_block(2, "tu_boom", "bedrock_explode", {"reason": "test"}),
            stop="tool_use",
            usage=(20, 8),
        ),
        turn(text_block(0, ["alpha is value-of-alpha"]), usage=(40, 6), cache_read=30, cache_write=5),
    )
    result, events = run(client, "bedrock_t.tools", "what is alpha?")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "alpha is value-of-alpha"
    assert [(e.data["id"], e.data["name"], e.data["args"]) for e in of(events, EventType.TOOL_CALL)] == [
        ("tu_lookup", "bedrock_lookup", {"key": "alpha"}),
        ("tu_boom", "bedrock_explode", {"reason": "test"}),
    ]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (60, 14)
    assert (result.usage.cache_read_tokens, result.usage.cache_write_tokens) == (30, 5)
    assert [s.raw_stop_reason for s in result.trace.steps] == ["tool_use", "end_turn"]

    first, second = fake.requests
    declared = first.body["toolConfig"]["tools"]
    assert [t["toolSpec"]["name"] for t in declared] == ["bedrock_lookup", "bedrock_explode"]
    assert declared[0]["toolSpec"]["inputSchema"]["json"]["properties"]["key"]["type"] == "string"
    assert declared[0]["toolSpec"]["description"] == "Look a key up in a tiny table."
    assert "toolConfig" in second.body  # Bedrock requires it whenever the history holds tool blocks

    assistant, results = second.body["messages"][-2:]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"text": "Let me check."},
            {"toolUse": {"toolUseId": "tu_lookup", "name": "bedrock_lookup", "input": {"key": "alpha"}}},
            {"toolUse": {"toolUseId": "tu_boom", "name": "bedrock_explode", "input": {"reason": "test"}}},
        ],
    }
    assert results == {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "tu_lookup",
                    "content": [{"json": {"key": "alpha", "value": "value-of-alpha"}}],
                    "status": "success",
                }
            },
            {
                "toolResult": {
                    "toolUseId": "tu_boom",
                    "content": [{"text": "Error executing tool bedrock_explode: ValueError: exploded: test"}],
                    "status": "error",
                }
            },
        ],
    }


def test_one_tool_call_per_step_runs_only_the_first_call(fake: FakeBedrock, worker: Any, client: Any) -> None:
    """parallel_tool_calls=False: Converse has no switch for it, so the engine runs the first call and the model
    reads "not run" for the others (every toolUse still gets its toolResult, as Bedrock requires)."""
    fake.add(
        turn(
            tool_block(0, "tu_a", "bedrock_lookup", {"key": "alpha"}),
            tool_block(1, "tu_b", "bedrock_explode", {"reason": "must not run"}),
            stop="tool_use",
        ),
        turn(text_block(0, ["done"])),
    )
    result, events = run(client, "bedrock_t.one_call", "look it up")

    assert result.status == TurnStatus.COMPLETED, result.error
    first, second = fake.requests
    assert set(first.body["toolConfig"]) == {"tools"}  # nothing native to send: ToolConfiguration has no switch
    assert "additionalModelRequestFields" not in first.body
    assert second.body["messages"][-1]["content"] == [
        {
            "toolResult": {
                "toolUseId": "tu_a",
                "content": [{"json": {"key": "alpha", "value": "value-of-alpha"}}],
                "status": "success",
            }
        },
        {
            "toolResult": {
                "toolUseId": "tu_b",
                "content": [
                    {
                        "text": "Error executing tool bedrock_explode: not run: one tool call per step "
                        "(parallel_tool_calls=False); call it again on its own"
                    }
                ],
                "status": "error",
            }
        },
    ]
    statuses = [(r.data["id"], r.data["status"]) for r in of(events, EventType.TOOL_RESULT)]
    assert statuses == [("tu_a", "ok"), ("tu_b", "denied")]


def test_reasoning_with_signature_is_sent_back_verbatim(fake: FakeBedrock, worker: Any, client: Any) -> None:
    opaque = b"\x00opaque-redacted\xff"
    fake.add(
        turn(
            reasoning_block(0, ["Think ", "hard."], "c2lnLWFiYw=="),
            redacted_block(1, opaque),
            tool_block(2, "tu_1", "bedrock_lookup", {"key": "k"}),
            stop="tool_use",
        ),
        turn(text_block(0, ["done"])),
    )
    result, events = run(client, "bedrock_t.thinking")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert "".join(e.data["text"] for e in of(events, EventType.REASONING_DELTA)) == "Think hard."
    first, second = fake.requests
    assert first.body["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    content = second.body["messages"][1]["content"]
    assert content[0] == {"reasoningContent": {"reasoningText": {"text": "Think hard.", "signature": "c2lnLWFiYw=="}}}
    assert content[1] == {"reasoningContent": {"redactedContent": base64.b64encode(opaque).decode()}}
    assert content[2]["toolUse"]["toolUseId"] == "tu_1"


def test_http_429_retry_after_sets_the_countdown(fake: FakeBedrock, worker: Any, client: Any) -> None:
    fake.add(
        ErrorReply(429, "ThrottlingException", "Too many requests, please wait", {"Retry-After": "1"}),
        turn(text_block(0, ["ok after ", "retry"])),
    )
    result, events = run(client, "bedrock_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "ok after retry"
    [retry] = of(events, EventType.STEP_RETRY)
    assert retry.data["countdown"] == 1.0
    assert retry.data["retry_after"] == 1.0
    assert (retry.data["status"], retry.data["code"]) == (429, "ThrottlingException")
    assert len(fake.requests) == 2  # the SDK made no retry of its own


@pytest.mark.parametrize("kind", ["throttlingException", "modelStreamErrorException"])
def test_in_stream_exception_before_content_is_retried(kind: str, fake: FakeBedrock, worker: Any, client: Any) -> None:
    fake.add(
        StreamReply([*message_start(), exception(kind, "please slow down")]),
        # the success: a text block with no contentBlockStart must still be captured
        turn(text_block(0, ["recovered ", "fine"])),
    )
    result, events = run(client, "bedrock_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "recovered fine"
    [retry] = of(events, EventType.STEP_RETRY)
    assert retry.data["code"] == kind
    assert len(fake.requests) == 2
    assert fake.requests[0].body == fake.requests[1].body


@pytest.mark.parametrize("ending", ["exception", "truncated"])
def test_usage_reported_by_a_failed_attempt_counts(ending: str, fake: FakeBedrock, worker: Any, client: Any) -> None:
    """Tokens Bedrock reported (a metadata event) before the attempt failed are billed: the step's trace lists
    the attempt with them and the turn's totals include them, as for the other providers."""
    failed: list[bytes | Any] = [*message_start(), *metadata(1234, 3, cache_read=200)]
    if ending == "exception":
        failed.append(exception("modelStreamErrorException", "the model stream broke"))
    fake.add(StreamReply(failed), turn(text_block(0, ["fine"]), usage=(1300, 7)))
    result, events = run(client, "bedrock_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert len(fake.requests) == 2
    [step] = result.trace.steps
    [attempt] = step.failed_attempts
    code = "modelStreamErrorException" if ending == "exception" else "incomplete_stream"
    assert attempt.attempt == 0 and attempt.error == code.lower()  # the metrics reason: the code, lower-cased
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (1234, 3)
    assert attempt.usage.cache_read_tokens == 200
    assert (attempt.provider, attempt.model) == ("bedrock", BEDROCK_MODEL)
    assert (step.usage.input_tokens, step.usage.output_tokens) == (1300, 7)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1234 + 1300, 3 + 7)
    assert result.usage.cache_read_tokens == 200
    [retry] = of(events, EventType.STEP_RETRY)
    assert retry.data["code"] == code


def test_in_stream_exception_after_content_fails_the_turn(fake: FakeBedrock, worker: Any, client: Any) -> None:
    frames = [
        *message_start(),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "partial "}}),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "answer"}}),
        exception("modelStreamErrorException", "the model stream broke"),
    ]
    fake.add(StreamReply(frames), turn(text_block(0, ["must not be requested"])))
    result, events = run(client, "bedrock_t.chat")

    assert result.status == TurnStatus.FAILED
    assert len(fake.requests) == 1
    assert [e.data["text"] for e in of(events, EventType.TEXT_DELTA)] == ["partial ", "answer"]
    assert not of(events, EventType.STEP_RETRY)
    assert result.error is not None and "modelStreamErrorException" in result.error
    assert "after content" in result.error


@pytest.mark.parametrize(
    ("status", "error_type", "message", "expected"),
    [
        (400, "ValidationException", "The provided model identifier is invalid.", "check the model name"),
        (400, "ValidationException", "Input is too long for requested model.", "context window"),
        (403, "AccessDeniedException", "You don't have access to the model.", "AWS_ACCESS_KEY_ID"),
    ],
)
def test_fatal_http_errors_are_not_retried(
    status: int, error_type: str, message: str, expected: str, fake: FakeBedrock, worker: Any, client: Any
) -> None:
    fake.add(ErrorReply(status, error_type, message), turn(text_block(0, ["must not be requested"])))
    result, events = run(client, "bedrock_t.chat")

    assert result.status == TurnStatus.FAILED
    assert result.finish_reason == FinishReason.ERROR
    assert len(fake.requests) == 1
    assert not of(events, EventType.STEP_RETRY)
    assert result.error is not None
    assert error_type in result.error and message in result.error and expected in result.error
    assert all(SECRET not in e.model_dump_json() for e in events)


def test_max_tokens_maps_to_length(fake: FakeBedrock, worker: Any, client: Any) -> None:
    fake.add(turn(text_block(0, ["cut sh"]), stop="max_tokens"))
    result, _ = run(client, "bedrock_t.chat")
    assert result.status == TurnStatus.COMPLETED
    assert result.finish_reason == FinishReason.LENGTH
    assert result.trace.steps[0].raw_stop_reason == "max_tokens"


def test_stall_before_content_is_retried(fake: FakeBedrock, worker: Any, client: Any) -> None:
    fake.add(StreamReply([*message_start(), Stall()]), turn(text_block(0, ["after the stall"])))
    result, events = run(client, "bedrock_t.stall")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "after the stall"
    [retry] = of(events, EventType.STEP_RETRY)
    assert retry.data["code"] == "stall"
    assert len(fake.requests) == 2


# --------------------------------------------------------------------------- the adapter alone


def _request(**kwargs: Any) -> StepRequest:
    values: dict[str, Any] = {"provider": "bedrock", "model": BEDROCK_MODEL, "messages": [UserMessage(content="hi")]}
    values.update(kwargs)
    return StepRequest(**values)


def test_should_stop_returns_what_was_gathered(fake: FakeBedrock) -> None:
    fake.add(turn(text_block(0, ["one ", "two ", "three"])))
    seen: list[str] = []
    output = bedrock.BedrockAdapter(BEDROCK_MODEL).stream_step(
        _request(), lambda d: seen.append(d.text), lambda: bool(seen)
    )
    assert seen == ["one "]
    assert output.message.text == "one "


def test_stream_without_message_stop_is_a_retryable_truncation(fake: FakeBedrock) -> None:
    fake.add(StreamReply([*message_start(), *text_block(0, ["cut"])]))
    with pytest.raises(ProviderError) as caught:
        bedrock.BedrockAdapter(BEDROCK_MODEL).stream_step(_request(), lambda d: None, lambda: False)
    assert caught.value.retryable and caught.value.code == "incomplete_stream"


def test_an_emit_failure_is_not_disguised_as_a_provider_error(fake: FakeBedrock) -> None:
    fake.add(turn(text_block(0, ["x"])))

    def broken_emit(delta: Any) -> None:
        raise RuntimeError("event log down")

    with pytest.raises(RuntimeError, match="event log down"):
        bedrock.BedrockAdapter(BEDROCK_MODEL).stream_step(_request(), broken_emit, lambda: False)


def test_connection_refused_is_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate_aws(monkeypatch)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    adapter = bedrock.BedrockAdapter(BEDROCK_MODEL, {"connect_timeout_s": 2})
    with pytest.raises(ProviderError) as caught:
        adapter.stream_step(_request(), lambda d: None, lambda: False)
    assert caught.value.retryable and caught.value.code == "connection"


def test_check_configured_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate_aws(monkeypatch)
    for name in ("AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SubmitError, match="AWS_REGION"):
        bedrock.check_configured()
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    with pytest.raises(SubmitError, match="AWS_ACCESS_KEY_ID"):
        bedrock.check_configured()
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", SECRET)
    bedrock.check_configured()
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    bedrock.check_configured()


def test_check_tools_refuses_what_bedrock_cannot_declare() -> None:
    schema = {"type": "object", "properties": {}}
    bedrock.check_tools([ToolSpec(name="ok_name-1", description="d", input_schema=schema)])
    with pytest.raises(DefinitionError, match=r"\[a-zA-Z0-9_-\]"):
        bedrock.check_tools([ToolSpec(name="ns.tool", description="d", input_schema=schema)])
    with pytest.raises(DefinitionError, match="1-64"):
        bedrock.check_tools([ToolSpec(name="x" * 65, description="d", input_schema=schema)])
    with pytest.raises(DefinitionError, match="'object'"):
        bedrock.check_tools([ToolSpec(name="arr", description="d", input_schema={"type": "array"})])


@pytest.mark.parametrize(
    ("raw", "has_calls", "expected"),
    [
        ("end_turn", False, FinishReason.STOP),
        ("stop_sequence", False, FinishReason.STOP),
        ("max_tokens", False, FinishReason.LENGTH),
        ("model_context_window_exceeded", False, FinishReason.LENGTH),
        ("tool_use", True, FinishReason.TOOL_CALLS),
        ("guardrail_intervened", False, FinishReason.CONTENT_FILTER),
        ("content_filtered", False, FinishReason.CONTENT_FILTER),
        ("malformed_tool_use", False, FinishReason.ERROR),
        ("something_new", False, FinishReason.STOP),
        ("something_new", True, FinishReason.TOOL_CALLS),
        (None, False, FinishReason.STOP),
    ],
)
def test_finish_reason_table(raw: str | None, has_calls: bool, expected: FinishReason) -> None:
    assert bedrock_wire.map_finish_reason(raw, has_calls) == expected


def test_frames_parse_with_botocore() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(event("messageStop", {"stopReason": "end_turn"}) + exception("throttlingException", "slow"))
    first, second = list(buffer)  # the SDK's own parser: prelude and message CRCs checked
    first_headers, second_headers = cast(dict[str, str], first.headers), cast(dict[str, str], second.headers)
    assert first_headers[":event-type"] == "messageStop" and b'"p": ' in first.payload
    assert second_headers[":message-type"] == "exception"
    assert second_headers[":exception-type"] == "throttlingException"


def test_transcript_translation_merges_roles_and_drops_foreign_reasoning() -> None:
    request = _request(
        system="sys",
        messages=[
            UserMessage(content="q"),
            AssistantMessage(
                parts=[
                    ReasoningPart(text="other", signature="x", provider="anthropic"),
                    TextPart(text=""),
                    ToolCall(id="t1", name="bedrock_lookup", args={"key": "a"}),
                ]
            ),
            ToolResultMessage(results=[ToolResult(tool_call_id="t1", name="bedrock_lookup", output=[1, 2])]),
            UserMessage(content="Your last tool call was malformed."),
        ],
        tools=[ToolSpec(name="bedrock_lookup", description="d", input_schema={"type": "object"})],
        tool_choice="required",
    )
    kwargs = bedrock_wire.build_request(request)
    assert [m["role"] for m in kwargs["messages"]] == ["user", "assistant", "user"]
    assert kwargs["messages"][1]["content"] == [
        {"toolUse": {"toolUseId": "t1", "name": "bedrock_lookup", "input": {"key": "a"}}}
    ]
    assert kwargs["messages"][2]["content"] == [
        {"toolResult": {"toolUseId": "t1", "content": [{"text": "[1, 2]"}], "status": "success"}},
        {"text": "Your last tool call was malformed."},
    ]
    assert kwargs["toolConfig"]["toolChoice"] == {"any": {}}


def test_turn_result_messages_round_trip_with_tool_cycle_and_reasoning(
    fake: FakeBedrock, worker: Any, client: Any
) -> None:
    """Turn 1's TurnResult.messages, submitted as turn 2, reach Bedrock with the cycle in its own shape."""
    fake.add(
        turn(
            reasoning_block(0, ["Think ", "hard."], "c2lnLWFiYw=="),
            tool_block(1, "tu_1", "bedrock_lookup", {"key": "k"}),
            stop="tool_use",
        ),
        turn(text_block(0, ["done"])),
        turn(text_block(0, ["second"])),
    )
    first, _ = run(client, "bedrock_t.thinking")
    assert first.status == TurnStatus.COMPLETED, first.error
    messages = [m.model_dump(mode="json") for m in first.messages] + [{"role": "user", "content": "again"}]
    second = client.submit("bedrock_t.thinking", messages=messages).wait(timeout=120)
    assert second.status == TurnStatus.COMPLETED and second.text == "second"

    _, turn1_step2, turn2 = fake.requests
    assert turn2.body["messages"][:3] == turn1_step2.body["messages"][:3]  # exactly what turn 1 sent back
    content = turn2.body["messages"][1]["content"]
    assert content[0] == {"reasoningContent": {"reasoningText": {"text": "Think hard.", "signature": "c2lnLWFiYw=="}}}
    assert content[1]["toolUse"] == {"toolUseId": "tu_1", "name": "bedrock_lookup", "input": {"key": "k"}}
    [result] = turn2.body["messages"][2]["content"]
    assert result["toolResult"]["toolUseId"] == "tu_1"
    assert [m["role"] for m in turn2.body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert turn2.body["messages"][4]["content"] == [{"text": "again"}]


def test_tool_use_input_fragments_stream_as_tool_input_deltas(fake: FakeBedrock, worker: Any, client: Any) -> None:
    """boto3's converse_stream against the fake's event-stream frames: each toolUse input fragment is a delta."""
    args = {"key": "a rather long key to look up"}
    fake.add(
        turn(tool_block(0, "tu_s", "bedrock_lookup", args, pieces=4), stop="tool_use"),
        turn(text_block(0, ["done"])),
    )
    result, events = run(client, "bedrock_t.tools", "look")
    assert result.status == TurnStatus.COMPLETED, result.error
    deltas = of(events, EventType.TOOL_INPUT_DELTA)
    assert len(deltas) == 4 and {(d.data["id"], d.data["name"]) for d in deltas} == {("tu_s", "bedrock_lookup")}
    [call] = of(events, EventType.TOOL_CALL)
    assert "".join(d.data["text"] for d in deltas) == json.dumps(args)
    assert call.data["args"] == args
