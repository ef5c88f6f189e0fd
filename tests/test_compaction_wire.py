"""Compaction on each provider's wire, through the real SDKs against the fakes (in-process steps on real
Redis): a long conversation over the (overridden, small) context window is summarised by a call the fake
sees with the summary instructions, and the step's own request that follows is smaller than the
conversation, starts with the summary and keeps every tool call with its result. Anthropic and Gemini
count through their count endpoints (the fakes answer at 4 characters a token); Bedrock and OpenAI
are estimated."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stepq.engine.compaction import SUMMARY_INSTRUCTIONS
from stepq.fleet.runtime import get_runtime
from stepq.models import TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_compaction import WIRE_MODELS, long_transcript
from tests.agents_engine import drive
from tests.conftest import make_settings
from tests.fakes import anthropic_server as a
from tests.fakes import bedrock_server as b
from tests.fakes import gemini_server as g
from tests.fakes import openai_server as o
from tests.test_provider_bedrock import _isolate_aws
from tests.test_provider_gemini import _GOOGLE_VARS

SUMMARY = "SUMMARY: six questions asked, six records looked up"


def _anthropic(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Callable[[], list[dict[str, Any]]]]]:
    server = a.FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789abcdef")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    server.enqueue(a.text_reply(SUMMARY), a.text_reply("final answer"))
    yield server, lambda: [r.body for r in server.requests if r.path == "/v1/messages"]
    server.stop()


def _gemini(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Callable[[], list[dict[str, Any]]]]]:
    server = g.FakeGemini().start()
    for var in _GOOGLE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GOOGLE_API_KEY", "test-gemini-key-0123456789")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.base_url)
    server.enqueue(g.text_reply(SUMMARY), g.text_reply("final answer"))
    yield server, lambda: [r.body for r in server.requests if "streamGenerateContent" in r.path]
    server.stop()


def _bedrock(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Callable[[], list[dict[str, Any]]]]]:
    server = b.FakeBedrock()
    _isolate_aws(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "bedrock-test-secret-0123456789")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.url)
    server.add(b.turn(b.text_block(0, [SUMMARY])), b.turn(b.text_block(0, ["final answer"])))
    yield server, lambda: [r.body for r in server.requests]
    server.close()


def _openai(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Callable[[], list[dict[str, Any]]]]]:
    server = o.FakeOpenAI().start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test-0123456789abcdef")
    for name in ("OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    server.enqueue(o.response_text(SUMMARY), o.response_text("final answer"))
    yield server, lambda: [r.body for r in server.requests if r.path.endswith("/responses")]
    server.stop()


FAKES = {"anthropic": _anthropic, "gemini": _gemini, "bedrock": _bedrock, "openai": _openai}


def _pairs(provider: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The request's tool calls and results in order, as ("call" | "result", id or name)."""
    found: list[tuple[str, str]] = []
    if provider == "anthropic":
        for m in body["messages"]:
            for block in m["content"] if isinstance(m["content"], list) else []:
                if block["type"] == "tool_use":
                    found.append(("call", block["id"]))
                elif block["type"] == "tool_result":
                    found.append(("result", block["tool_use_id"]))
    elif provider == "gemini":
        for content in body["contents"]:
            for part in content["parts"]:
                if "functionCall" in part:
                    found.append(("call", part["functionCall"]["name"]))
                elif "functionResponse" in part:
                    found.append(("result", part["functionResponse"]["name"]))
    elif provider == "bedrock":
        for m in body["messages"]:
            for block in m["content"]:
                if "toolUse" in block:
                    found.append(("call", block["toolUse"]["toolUseId"]))
                elif "toolResult" in block:
                    found.append(("result", block["toolResult"]["toolUseId"]))
    else:
        for item in body["input"]:
            if item.get("type") == "function_call":
                found.append(("call", item["call_id"]))
            elif item.get("type") == "function_call_output":
                found.append(("result", item["call_id"]))
    return found


def _assert_pairs_intact(provider: str, body: dict[str, Any]) -> None:
    open_calls: list[str] = []
    for kind, ident in _pairs(provider, body):
        if kind == "call":
            open_calls.append(ident)
        else:
            assert ident in open_calls, f"a result for {ident} with no call before it"
            open_calls.remove(ident)
    assert not open_calls, f"calls without results: {open_calls}"


@pytest.mark.parametrize("provider", list(FAKES))
def test_a_long_conversation_is_compacted_on_the_wire(provider, prefix, monkeypatch):
    fixture = FAKES[provider](monkeypatch)
    server, streamed = next(fixture)
    try:
        windows = {WIRE_MODELS[provider]: 8000}
        rt = get_runtime(make_settings(prefix, context_windows=windows, compact_at=0.5))
        messages = long_transcript()
        state, _ = create_turn(rt, f"cp.{provider}", messages=messages, metadata={"prefix": prefix})
        final = drive(rt, state.turn_id)
        assert final.status == TurnStatus.COMPLETED, final.error
        assert final.text == "final answer"

        summary_call, step_call = streamed()
        assert SUMMARY_INSTRUCTIONS in json.dumps(summary_call)  # the summary call, with its instructions
        assert "question 0" in json.dumps(summary_call)  # ... given the older turns
        sent = json.dumps(step_call)
        assert len(sent) < sum(len(json.dumps(m)) for m in messages)  # smaller than the conversation
        assert SUMMARY in sent and "final question" in sent and "question 0:" not in sent
        assert sent.count("r" * 4000) == 1  # only the latest result (STEPQ_COMPACT_KEEP_RECENT) is whole
        _assert_pairs_intact(provider, step_call)
        assert _pairs(provider, step_call), "the kept part still carries a tool cycle"

        [event] = [e for e in rt.events.read(state.turn_id) if e.type == "context-compacted"]
        expected = "provider" if provider in ("anthropic", "gemini") else "estimate"
        assert event.data["counted_by"] == expected and event.data["messages_summarised"] > 0
        assert event.data["tokens_after"] < event.data["tokens_before"]
        [traced] = [t for t in final.trace.steps if t.kind == "compaction"]
        assert traced.usage.total_tokens > 0  # the summary call's usage is the turn's too
        assert len(final.messages) == len(messages) + 1  # the record keeps the whole conversation
        if provider in ("anthropic", "gemini"):  # the count endpoint was used
            counted = [r for r in server.requests if "count" in r.path.lower()]
            assert counted
    finally:
        next(fixture, None)
