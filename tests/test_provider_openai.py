"""The `openai`, `openai-compatible` and `azure-openai` adapters: the unmodified `openai` SDK against a local
fake OpenAI API (Responses and Chat Completions streams), driven through full stepq turns
(client.submit -> in-process Celery worker on real Redis -> events -> wait)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from stepq.config.settings import Settings
from stepq.engine.pricing import step_cost
from stepq.errors import DefinitionError, SubmitError
from stepq.models import EventType, FinishReason, ToolSpec, TurnStatus
from tests.conftest import make_settings
from tests.fakes.openai_server import (
    ErrorReply,
    FakeOpenAI,
    SSEReply,
    call_item,
    chat_error,
    chat_stream,
    chat_text,
    chat_tool_call,
    chat_usage,
    chunk,
    error_event,
    reasoning_item,
    response_stream,
    response_text,
    text_item,
)

API_KEY = "sk-openai-test-0123456789abcdef"
WAIT = 120  # generous: the machine is shared and busy


@pytest.fixture
def settings(prefix: str) -> Settings:
    """No delta coalescing: every streamed chunk is its own text-delta event."""
    return make_settings(prefix, coalesce_window_ms=0)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    for name in ("OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "STEPQ_OPENAI_COMPATIBLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPQ_OPENAI_COMPATIBLE_BASE_URL", server.base_url + "/v1")
    yield server
    server.stop()


def run(client: Any, agent: str, prompt: str = "hi") -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt=prompt)
    result = handle.wait(timeout=WAIT)
    return result, list(handle.events())


def of_type(events: list[Any], kind: EventType) -> list[Any]:
    return [e for e in events if e.type == kind]


# --------------------------------------------------------------------------- Responses API (`openai`)


def test_streamed_text_arrives_as_several_deltas(worker, client, fake):
    fake.enqueue(response_text("Hel", "lo ", "wor", "ld", input_tokens=12, output_tokens=4))
    result, events = run(client, "openai_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "Hello world"
    assert result.finish_reason == FinishReason.STOP
    assert [e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)] == ["Hel", "lo ", "wor", "ld"]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 4)
    [request] = fake.wait_for_requests(1)
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == "<present>"
    assert request.headers.get("x-stainless-retry-count") == "0"
    body = request.body
    assert body["model"] == "gpt-test" and body["stream"] is True and body["store"] is False
    assert body["instructions"] == "You are a terse test assistant."
    assert body["input"] == [{"role": "user", "content": "hi"}]
    assert [t["name"] for t in body["tools"]] == ["openai_lookup", "openai_fail"]
    assert body["tools"][0]["type"] == "function"
    assert body["tools"][0]["parameters"]["properties"]["query"]["type"] == "string"
    assert "tool_choice" not in body and "reasoning" not in body and "text" not in body


def test_one_tool_call_per_step_is_asked_of_the_api(worker, client, fake):
    """parallel_tool_calls=False on the agent goes out as OpenAI's own switch."""
    fake.enqueue(response_text("ok"))
    result, _ = run(client, "openai_t.one_call")

    assert result.status == TurnStatus.COMPLETED, result.error
    [request] = fake.wait_for_requests(1)
    assert request.body["parallel_tool_calls"] is False


def test_tool_round_trip_with_cached_token_usage(worker, client, fake, settings):
    fake.enqueue(
        response_stream(
            text_item(["Let me look."]),
            call_item("call_1", "openai_lookup", ['{"que', 'ry": "x"}']),
            call_item("call_2", "openai_fail", ['{"reason": "boom"}']),
            input_tokens=100,
            output_tokens=6,
        ),
        response_text("done", input_tokens=130, output_tokens=3, cached=100),
    )
    result, events = run(client, "openai_t.chat", prompt="find x")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "done"
    assert [s.stop_reason for s in result.trace.steps] == ["tool-calls", "stop"]
    assert [s.provider for s in result.trace.steps] == ["openai", "openai"]
    assert result.usage.total_tokens == 100 + 6 + 130 + 3
    assert result.usage.cache_read_tokens == 100
    calls = of_type(events, EventType.TOOL_CALL)
    assert [(c.data["id"], c.data["args"]) for c in calls] == [
        ("call_1", {"query": "x"}),
        ("call_2", {"reason": "boom"}),
    ]
    _, second = fake.wait_for_requests(2)
    items = second.body["input"]
    assert items[0] == {"role": "user", "content": "find x"}
    assert items[1] == {"role": "assistant", "content": "Let me look."}
    assert items[2] == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "openai_lookup",
        "arguments": '{"query": "x"}',
    }
    assert items[4] == {"type": "function_call_output", "call_id": "call_1", "output": '{"answer": "result for x"}'}
    assert items[5]["call_id"] == "call_2" and items[5]["output"].startswith("Error executing tool openai_fail:")


def test_cached_input_is_priced_at_the_cache_price(fake):
    from stepq.config.settings import Prices
    from stepq.models import Usage

    prices = {"openai/gpt-test": Prices(input_per_mtok=2.0, output_per_mtok=8.0, cache_read_per_mtok=0.5)}
    usage = Usage(input_tokens=1_000_000, output_tokens=0, cache_read_tokens=400_000)
    assert step_cost(prices, "openai", "gpt-test", usage) == pytest.approx(600_000 * 2.0 / 1e6 + 400_000 * 0.5 / 1e6)


def test_reasoning_summaries_stream_and_go_back_encrypted(worker, client, fake):
    fake.enqueue(
        response_stream(
            reasoning_item(["Thinking ", "hard."], "enc-blob-1"),
            call_item("call_r", "openai_lookup", ['{"query": "q"}']),
            reasoning=7,
        ),
        response_text("answer"),
    )
    result, events = run(client, "openai_t.reasoning")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert [e.data["text"] for e in of_type(events, EventType.REASONING_DELTA)] == ["Thinking ", "hard."]
    assert result.trace.steps[0].usage.reasoning_tokens == 7
    first, second = fake.wait_for_requests(2)
    assert first.body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert first.body["include"] == ["reasoning.encrypted_content"]
    assert second.body["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Thinking hard."}],
        "encrypted_content": "enc-blob-1",
    }


def test_structured_output_uses_the_native_json_schema_mode(worker, client, fake):
    fake.enqueue(response_text('{"name": "Ada", ', '"email": "ada@example.com"}'))
    result, events = run(client, "openai_t.extract", prompt="Ada, ada@example.com")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"name": "Ada", "email": "ada@example.com"}
    assert "".join(e.data["text"] for e in of_type(events, EventType.OBJECT_DELTA)) == json.dumps(result.object)
    [request] = fake.wait_for_requests(1)
    fmt = request.body["text"]["format"]
    assert fmt["type"] == "json_schema" and fmt["strict"] is True and fmt["name"] == "stepq_output"
    assert set(fmt["schema"]["properties"]) == {"name", "email"}
    assert "tools" not in request.body


def test_max_output_tokens_maps_to_length(worker, client, fake):
    fake.enqueue(response_text("cut", incomplete="max_output_tokens"))
    result, _ = run(client, "openai_t.chat")
    assert result.finish_reason == FinishReason.LENGTH
    assert result.trace.steps[0].raw_stop_reason == "max_output_tokens"


# --------------------------------------------------------------------------- failures and retries


def test_429_retry_after_before_content_is_retried(worker, client, fake):
    fake.enqueue(
        ErrorReply(429, "rate_limit_exceeded", "slow down", "requests", {"retry-after": "1"}), response_text("ok")
    )
    result, events = run(client, "openai_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "ok"
    [retry] = of_type(events, EventType.STEP_RETRY)
    assert retry.data["countdown"] == 1.0 and retry.data["retry_after"] == 1.0
    assert retry.data["status"] == 429 and retry.data["code"] == "rate_limit_exceeded"
    assert len(fake.wait_for_requests(2)) == 2


def test_error_event_before_content_is_retried(worker, client, fake):
    created = response_text("x").events[:1]
    fake.enqueue(SSEReply([*created, error_event("server_error", "The server had an error")]), response_text("fine"))
    result, events = run(client, "openai_t.chat")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "fine"
    [retry] = of_type(events, EventType.STEP_RETRY)
    assert retry.data["code"] == "server_error"
    types = [e.type for e in events]
    assert EventType.TEXT_DELTA not in types[: types.index(EventType.STEP_RETRY)]
    assert len(fake.requests) == 2


def test_error_event_after_content_fails_without_retry(worker, client, fake):
    partial = response_text("partial ", "answer").events[:4]  # created, item added, two deltas
    fake.enqueue(SSEReply([*partial, error_event("server_error", "boom")]), response_text("must not be requested"))
    result, events = run(client, "openai_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "") and "server_error" in (result.error or "")
    assert result.text == "partial answer"
    assert not of_type(events, EventType.STEP_RETRY)
    assert len(fake.requests) == 1


def test_400_is_fatal_and_401_never_shows_the_key(worker, client, fake):
    fake.enqueue(ErrorReply(401, "invalid_api_key", f"Incorrect API key provided: {API_KEY}", "invalid_request_error"))
    result, events = run(client, "openai_t.chat")

    assert result.status == TurnStatus.FAILED
    assert "401" in (result.error or "") and "OPENAI_API_KEY" in (result.error or "")
    assert API_KEY not in json.dumps([e.data for e in events]) and API_KEY not in (result.error or "")
    assert len(fake.requests) == 1


def test_stream_cut_before_completion_is_retried(worker, client, fake):
    fake.enqueue(SSEReply(response_text("x").events, close_after=1), response_text("whole"))
    result, events = run(client, "openai_t.chat")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "whole"
    assert [r.data["code"] for r in of_type(events, EventType.STEP_RETRY)] == ["incomplete"]


def test_stalled_stream_is_retried(worker, client, fake):
    fake.enqueue(SSEReply(response_text("x").events, hold_after=1), response_text("after stall"))
    result, events = run(client, "openai_t.stall")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "after stall"
    assert [r.data["code"] for r in of_type(events, EventType.STEP_RETRY)] == ["stall"]


# --------------------------------------------------------------------------- Chat Completions (`openai-compatible`)


def test_compatible_server_streams_and_round_trips_tools_over_chat_completions(worker, client, fake):
    fake.enqueue(
        chat_stream(chat_tool_call("call_c", "openai_lookup", ['{"query"', ': "z"}']), finish="tool_calls"),
        chat_text("compat ", "done", prompt=40, completion=2, cached=32),
    )
    result, events = run(client, "openai_t.compat", prompt="find z")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "compat done"
    assert [e.data["text"] for e in of_type(events, EventType.TEXT_DELTA)] == ["compat ", "done"]
    assert [s.provider for s in result.trace.steps] == ["openai-compatible", "openai-compatible"]
    assert [s.stop_reason for s in result.trace.steps] == ["tool-calls", "stop"]
    assert result.usage.cache_read_tokens == 32
    first, second = fake.wait_for_requests(2)
    assert first.path == "/v1/chat/completions"
    assert first.body["stream_options"] == {"include_usage": True}
    assert first.body["messages"] == [
        {"role": "system", "content": "Compatible server."},
        {"role": "user", "content": "find z"},
    ]
    assert first.body["tools"][0]["function"]["name"] == "openai_lookup"
    assert second.body["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_c", "type": "function", "function": {"name": "openai_lookup", "arguments": '{"query": "z"}'}}
        ],
    }
    assert second.body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_c",
        "content": '{"answer": "result for z"}',
    }


def test_compatible_structured_output_uses_response_format(worker, client, fake):
    fake.enqueue(chat_text('{"name": "Bo", "email": "bo@example.com"}'))
    result, _ = run(client, "openai_t.compat_extract")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"name": "Bo", "email": "bo@example.com"}
    [request] = fake.wait_for_requests(1)
    assert request.body["response_format"]["type"] == "json_schema"
    assert request.body["response_format"]["json_schema"]["name"] == "stepq_output"


def test_compatible_in_stream_error_before_content_retries_and_after_content_fails(worker, client, fake):
    fake.enqueue(
        SSEReply([chunk({"role": "assistant", "content": ""}), chat_error("overloaded", "server_error")], named=False),
        chat_text("recovered"),
    )
    result, events = run(client, "openai_t.compat")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "recovered"
    assert len(of_type(events, EventType.STEP_RETRY)) == 1

    fake.enqueue(SSEReply([chunk({"content": "half"}), chat_error("overloaded", "server_error")], named=False))
    result, events = run(client, "openai_t.compat")
    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "")
    assert not of_type(events, EventType.STEP_RETRY)


def test_compatible_stream_ending_without_finish_reason_retries_before_content_and_fails_after(worker, client, fake):
    opening = chunk({"role": "assistant", "content": ""})
    usage = chunk(None, usage=chat_usage(10, 5))
    fake.enqueue(SSEReply([opening, usage], named=False, done=True), chat_text("whole"))  # [DONE], no finish_reason
    result, events = run(client, "openai_t.compat")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "whole"
    assert [r.data["code"] for r in of_type(events, EventType.STEP_RETRY)] == ["incomplete"]

    fake.enqueue(SSEReply([opening, chunk({"content": "half"}), usage], named=False, done=True), chat_text("never"))
    result, events = run(client, "openai_t.compat")
    assert result.status == TurnStatus.FAILED
    assert "after content" in (result.error or "") and "before the response completed" in (result.error or "")
    assert not of_type(events, EventType.STEP_RETRY)


def test_compatible_needs_a_base_url(client, fake, monkeypatch):
    monkeypatch.delenv("STEPQ_OPENAI_COMPATIBLE_BASE_URL")
    monkeypatch.delenv("OPENAI_BASE_URL")
    from stepq.agents.registry import registry
    from stepq.providers.registry import create_adapter

    agent = registry().get("openai_t.compat")
    assert agent is not None
    with pytest.raises(SubmitError, match="STEPQ_OPENAI_COMPATIBLE_BASE_URL"):
        create_adapter("openai-compatible", agent, "local-model")


# --------------------------------------------------------------------------- Azure OpenAI


def test_azure_openai_uses_the_deployment_route_and_api_key_header(worker, client, fake, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", fake.base_url)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key-0123456789")
    monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
    monkeypatch.delenv("AZURE_OPENAI_AD_TOKEN", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL")  # the Azure client refuses a base URL next to its endpoint
    fake.enqueue(chat_text("from ", "azure"))
    result, _ = run(client, "openai_t.azure")

    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.text == "from azure"
    [request] = fake.wait_for_requests(1)
    assert request.path == "/openai/deployments/my-deployment/chat/completions?api-version=2024-10-21"
    assert request.headers["api-key"] == "<present>"


def test_azure_unconfigured_fails_at_submit(client, fake, monkeypatch):
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    with pytest.raises(SubmitError, match="AZURE_OPENAI_ENDPOINT"):
        client.submit("openai_t.azure", prompt="hi")


def test_openai_unconfigured_fails_at_submit(client, fake, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(SubmitError, match="OPENAI_API_KEY"):
        client.submit("openai_t.chat", prompt="hi")


# --------------------------------------------------------------------------- definitions


def test_check_tools_rejects_what_openai_cannot_declare():
    from stepq.providers.openai.wire import check_tools

    with pytest.raises(DefinitionError, match="must match"):
        check_tools([ToolSpec(name="bad name", description="", input_schema={})])
    with pytest.raises(DefinitionError, match="root is a JSON object"):
        check_tools([ToolSpec(name="arr", description="", input_schema={"type": "array"})])


def test_a_compatible_server_saying_stop_next_to_tool_calls_still_ends_in_tool_calls():
    from openai.types.chat import ChatCompletionChunk

    from stepq.providers.openai.stream import ChatAccumulator

    deltas: list[Any] = []
    acc = ChatAccumulator(deltas.append, schema_answer=False, step=0)
    for raw in [*chat_tool_call("call_s", "openai_lookup", ['{"query": "s"}']), chunk({}, "stop")]:
        acc.feed(ChatCompletionChunk.model_validate(raw))
    output = acc.output()
    assert output.finish_reason == FinishReason.TOOL_CALLS and output.raw_finish_reason == "stop"
    assert [(c.id, c.args) for c in output.message.tool_calls] == [("call_s", {"query": "s"})]


# --------------------------------------------------------------------------- secrets


COMPAT_KEY = "sk-compat-own-variable-9f8e7d6c5b4a"


@pytest.mark.parametrize("where", ["http-error", "in-stream-error"])
def test_a_key_from_the_agents_api_key_env_never_reaches_errors_or_events(worker, client, fake, rt, monkeypatch, where):
    """The server echoes the key it was sent (as some proxies do): the agent's own variable is masked like
    OPENAI_API_KEY is."""
    monkeypatch.setenv("OPENAI_T_COMPAT_KEY", COMPAT_KEY)
    echo = f"Incorrect API key provided: {COMPAT_KEY}. You can find your API key at https://example.invalid"
    if where == "http-error":
        fake.enqueue(ErrorReply(401, "invalid_api_key", echo, "invalid_request_error"))
    else:
        fake.enqueue(
            SSEReply(
                [
                    chunk({"role": "assistant", "content": ""}),
                    chat_error(echo, "invalid_request_error", "invalid_api_key"),
                ],
                named=False,
            )
        )
    result, events = run(client, "openai_t.compat_keyed")

    assert result.status == TurnStatus.FAILED
    assert "Incorrect API key provided: ***" in (result.error or ""), result.error
    assert COMPAT_KEY not in (result.error or "")
    assert COMPAT_KEY not in json.dumps([e.data for e in events])
    stored = rt.redis.get(rt.keys.turn(result.turn_id))
    assert stored is not None and COMPAT_KEY.encode() not in (stored if isinstance(stored, bytes) else stored.encode())
    assert len(fake.requests) == 1


def test_turn_result_messages_round_trip_with_tool_cycle_and_reasoning(worker, client, fake):
    """Turn 1's TurnResult.messages, submitted as turn 2, reach the Responses API with the cycle in its shape."""
    fake.enqueue(
        response_stream(
            reasoning_item(["Thinking ", "hard."], "enc-blob-1"),
            call_item("call_r", "openai_lookup", ['{"query": "q"}']),
        ),
        response_text("answer"),
        response_text("second"),
    )
    first, _ = run(client, "openai_t.reasoning")
    assert first.status == TurnStatus.COMPLETED, first.error
    messages = [m.model_dump(mode="json") for m in first.messages] + [{"role": "user", "content": "again"}]
    second = client.submit("openai_t.reasoning", messages=messages).wait(timeout=WAIT)
    assert second.status == TurnStatus.COMPLETED and second.text == "second"

    _, turn1_step2, turn2 = (r.body for r in fake.wait_for_requests(3))
    assert turn2["input"][:4] == turn1_step2["input"][:4]  # exactly what turn 1 itself sent back
    assert turn2["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Thinking hard."}],
        "encrypted_content": "enc-blob-1",
    }
    kinds = [item.get("type", item.get("role")) for item in turn2["input"]]
    assert kinds[2:4] == ["function_call", "function_call_output"]
    assert turn2["input"][2]["call_id"] == turn2["input"][3]["call_id"] == "call_r"
    assert turn2["input"][-1]["role"] == "user"


# --------------------------------------------------------------------------- tool-input streaming


def _tool_input_pieces(events: list[Any]) -> list[tuple[str, str, str]]:
    return [(e.data["id"], e.data["name"], e.data["text"]) for e in of_type(events, EventType.TOOL_INPUT_DELTA)]


def test_responses_function_call_arguments_stream_as_tool_input_deltas(worker, client, fake):
    pieces = ['{"que', 'ry": "a long', ' argument"}']
    fake.enqueue(response_stream(call_item("call_s", "openai_lookup", pieces)), response_text("done"))
    result, events = run(client, "openai_t.chat", prompt="find")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert _tool_input_pieces(events) == [("call_s", "openai_lookup", p) for p in pieces]
    [call] = of_type(events, EventType.TOOL_CALL)
    assert json.loads("".join(pieces)) == call.data["args"] == {"query": "a long argument"}


def test_chat_completions_argument_fragments_stream_as_tool_input_deltas(worker, client, fake):
    pieces = ['{"query"', ': "z', 'z"}']
    fake.enqueue(chat_stream(chat_tool_call("call_c", "openai_lookup", pieces), finish="tool_calls"), chat_text("done"))
    result, events = run(client, "openai_t.compat", prompt="find")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert _tool_input_pieces(events) == [("call_c", "openai_lookup", p) for p in pieces]
    [call] = of_type(events, EventType.TOOL_CALL)
    assert call.data["args"] == {"query": "zz"}
