"""Native structured output: the output schema reaches each provider as a forced tool (Anthropic,
Bedrock), the answer streams as object deltas, and validation failures are repaired or named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from stepq.models import EventType, TurnStatus, UserMessage
from stepq.providers.base import OUTPUT_TOOL
from tests.fakes import anthropic_server as anth
from tests.fakes import bedrock_server as bed

WAIT = 120  # generous: the machine is shared and busy


@pytest.fixture
def anthropic_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[anth.FakeAnthropic]:
    server = anth.FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-structured")
    yield server
    server.stop()


@pytest.fixture
def bedrock_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[bed.FakeBedrock]:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/stepq-test/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/stepq-test/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = bed.FakeBedrock()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "structured-secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.url)
    yield server
    server.close()


def _run(client: Any, agent: str) -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt="Ada Lovelace, ada@engines.example")
    return handle.wait(timeout=WAIT), list(handle.events())


def _anthropic_answer(tool_id: str, chunks: list[str]) -> anth.SSEReply:
    return anth.stream(anth.tool_use_block(0, tool_id, OUTPUT_TOOL, chunks), stop_reason="tool_use")


def test_anthropic_forced_output_tool(anthropic_fake, worker, client):
    anthropic_fake.enqueue(
        _anthropic_answer("toolu_1", ['{"name": "Ada Lovelace", ', '"email": "ada@engines.example"}'])
    )
    result, events = _run(client, "st.anthropic_extract")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"name": "Ada Lovelace", "email": "ada@engines.example"}
    body = anthropic_fake.bodies()[0]
    [declared] = [t for t in body["tools"] if t["name"] == OUTPUT_TOOL]
    assert set(declared["input_schema"]["required"]) == {"name", "email"}
    assert body["tool_choice"]["type"] == "tool" and body["tool_choice"]["name"] == OUTPUT_TOOL
    deltas = [e.data["text"] for e in events if e.type == EventType.OBJECT_DELTA]
    assert json.loads("".join(deltas)) == result.object


def test_anthropic_tools_first_then_the_reserved_last_step_is_forced(anthropic_fake, worker, client):
    anthropic_fake.enqueue(
        anth.stream(anth.tool_use_block(0, "toolu_a", "st_lookup", ['{"name": "Ada"}']), stop_reason="tool_use"),
        _anthropic_answer("toolu_b", ['{"name": "Ada", "email": "ada@example.com"}']),
    )
    result, _ = _run(client, "st.anthropic_tools_first")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"name": "Ada", "email": "ada@example.com"}
    first, last = anthropic_fake.bodies()
    assert first["tool_choice"]["type"] == "auto"  # free to use tools first
    assert {t["name"] for t in first["tools"]} == {"st_lookup", OUTPUT_TOOL}
    assert last["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL} | {
        k: v for k, v in last["tool_choice"].items() if k not in ("type", "name")
    }


def test_anthropic_invalid_object_is_repaired_with_the_errors_named(anthropic_fake, worker, client):
    anthropic_fake.enqueue(
        _anthropic_answer("toolu_1", ['{"name": "Ada Lovelace"}']),
        _anthropic_answer("toolu_2", ['{"name": "Ada Lovelace", "email": "ada@engines.example"}']),
    )
    result, _ = _run(client, "st.anthropic_extract")
    assert result.status == TurnStatus.COMPLETED
    assert result.object["email"] == "ada@engines.example"
    repair = anthropic_fake.bodies()[1]["messages"][-1]
    text = json.dumps(repair)
    assert "email" in text and "Field required" in text


def test_bedrock_forced_tool_choice_and_final_failure_names_errors(bedrock_fake, worker, client):
    bad = bed.turn(bed.tool_block(0, "tu_1", OUTPUT_TOOL, {"name": "Ada"}), stop="tool_use")
    still_bad = bed.turn(bed.tool_block(0, "tu_2", OUTPUT_TOOL, {"email": 5}), stop="tool_use")
    worse = bed.turn(bed.tool_block(0, "tu_3", OUTPUT_TOOL, {"name": 1}), stop="tool_use")
    bedrock_fake.add(bad, still_bad, worse)
    result, events = _run(client, "st.bedrock_extract")
    assert result.status == TurnStatus.FAILED
    assert "email" in result.error and "name" in result.error  # the last answer's problems, named
    requests = bedrock_fake.requests
    assert len(requests) == 3  # the answer plus output_repairs=2 repair steps
    config = requests[0].body["toolConfig"]
    assert config["toolChoice"] == {"tool": {"name": OUTPUT_TOOL}}
    [spec] = [t["toolSpec"] for t in config["tools"] if t["toolSpec"]["name"] == OUTPUT_TOOL]
    assert set(spec["inputSchema"]["json"]["required"]) == {"name", "email"}
    assert any(e.type == EventType.OBJECT_DELTA for e in events)


def test_scripted_non_object_schema_is_wrapped_and_unwrapped(worker, client):
    result, events = _run(client, "st.scripted_tools_first")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == ["ada@example.com"]
    starts = [e for e in events if e.type == EventType.STEP_START]
    assert OUTPUT_TOOL in starts[0].data["tools"]
    state = client.get(result.turn_id)
    assert not any(isinstance(m, UserMessage) and "did not match" in m.content for m in state.messages)


@pytest.fixture
def gemini_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tests.fakes import gemini_server as gem
    from tests.test_provider_gemini import _clear_env

    _clear_env(monkeypatch)
    server = gem.FakeGemini().start()
    monkeypatch.setenv("GOOGLE_API_KEY", "gemini-structured-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.base_url)
    yield server
    server.stop()


def test_gemini_answers_through_response_schema(gemini_fake, worker, client):
    from tests.fakes import gemini_server as gem

    gemini_fake.enqueue(gem.text_reply('{"name": "Ada Lovelace", ', '"email": "ada@engines.example"}'))
    result, events = _run(client, "st.gemini_extract")
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"name": "Ada Lovelace", "email": "ada@engines.example"}
    config = gemini_fake.bodies()[0]["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    schema = json.dumps(config.get("responseJsonSchema") or config.get("responseSchema"))
    assert "email" in schema and "name" in schema
    assert "tools" not in gemini_fake.bodies()[0]  # no function calling alongside a JSON schema
    assert "".join(e.data["text"] for e in events if e.type == EventType.OBJECT_DELTA) == json.dumps(result.object)


def test_gemini_tools_first_then_schema_on_the_reserved_step(gemini_fake, worker, client):
    from tests.fakes import gemini_server as gem

    gemini_fake.enqueue(
        gem.parts_reply(gem.function_call("st_lookup", {"name": "Ada"})),
        gem.text_reply('{"name": "Ada", "email": "ada@example.com"}'),
    )
    result, _ = _run(client, "st.gemini_tools_first")
    assert result.status == TurnStatus.COMPLETED, result.error
    first, last = gemini_fake.bodies()
    declared = {d["name"] for t in first["tools"] for d in t["functionDeclarations"]}
    assert declared == {"st_lookup", OUTPUT_TOOL}
    assert "responseMimeType" not in first.get("generationConfig", {})
    assert last["generationConfig"]["responseMimeType"] == "application/json"
