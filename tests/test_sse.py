"""The lean SSE decoder (stepq.providers.sse) and the raw-stream readers, on wire bytes captured from the fakes.

Each stream is recorded off the fake server's socket (the bytes the SDKs would read), then decoded by
`iter_events` whole, cut at every byte, one byte at a time and with CRLF / CR line ends; the SDK's own
decoder (`anthropic._streaming.SSEDecoder`) on the same bytes is the reference. The readers' step
output is compared with the SDK's typed stream's on the same capture.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from anthropic._streaming import SSEDecoder

from stepq.models import Delta, FinishReason
from stepq.providers.anthropic.raw_stream import read_stream as read_anthropic
from stepq.providers.anthropic.stream import StreamAccumulator
from stepq.providers.base import ProviderError
from stepq.providers.openai.raw_stream import read_stream as read_openai
from stepq.providers.openai.stream import ChatAccumulator, ResponsesAccumulator
from stepq.providers.sse import iter_events
from tests.fakes import anthropic_server as fa
from tests.fakes import openai_server as fo


def _capture(server: Any, path: str, body: dict[str, Any]) -> bytes:
    server.start()
    try:
        reply = httpx.post(server.base_url + path, json=body, headers={"x-api-key": "k", "authorization": "Bearer k"})
        assert reply.status_code == 200, reply.text
        return reply.content
    finally:
        server.stop()


def anthropic_capture(*replies: fa.SSEReply) -> bytes:
    fake = fa.FakeAnthropic()
    fake.enqueue(*replies)
    return _capture(fake, "/v1/messages", {"model": "m", "max_tokens": 10, "stream": True, "messages": []})


def openai_capture(reply: fo.SSEReply, path: str = "/v1/responses") -> bytes:
    fake = fo.FakeOpenAI()
    fake.enqueue(reply)
    return _capture(fake, path, {"model": "m", "stream": True, "input": "hi", "messages": []})


ANTHROPIC_MIXED = fa.stream(
    fa.thinking_block(0, ["let me ", "think"], "sig=="),
    fa.text_block(1, ["Hello", ", wörld ✓"]),
    fa.tool_use_block(2, "toolu_1", "lookup", ['{"q"', ': "x"}']),
    stop_reason="tool_use",
    thinking_tokens=3,
)


@pytest.fixture(scope="module")
def captures() -> dict[str, bytes]:
    return {
        "anthropic": anthropic_capture(ANTHROPIC_MIXED),
        "responses": openai_capture(fo.response_text("Hi ", "there")),
        "chat": openai_capture(fo.chat_text("Hi ", "there"), "/v1/chat/completions"),
    }


def reference(raw: bytes) -> list[tuple[str | None, bytes]]:
    """The SDK decoder's events on the same bytes, as (event, data)."""
    return [(e.event, e.data.encode()) for e in SSEDecoder().iter_bytes(iter([raw]))]


def variants(raw: bytes) -> Iterator[tuple[str, list[bytes]]]:
    yield "whole", [raw]
    yield "bytewise", [raw[i : i + 1] for i in range(len(raw))]
    for cut in range(1, len(raw)):
        yield f"cut at {cut}", [raw[:cut], raw[cut:]]
    crlf = raw.replace(b"\n", b"\r\n")
    yield "crlf bytewise", [crlf[i : i + 1] for i in range(len(crlf))]
    for cut in range(1, len(crlf), 7):
        yield f"crlf cut at {cut}", [crlf[:cut], crlf[cut:]]
    yield "cr", [raw.replace(b"\n", b"\r")]


@pytest.mark.parametrize("name", ["anthropic", "responses", "chat"])
def test_decodes_like_the_sdk_however_the_bytes_arrive(captures: dict[str, bytes], name: str) -> None:
    raw = captures[name]
    expected = reference(raw)
    assert len(expected) > 5
    for label, chunks in variants(raw):
        assert list(iter_events(chunks)) == expected, label


def test_field_rules() -> None:
    stream = b": comment\nid: 7\nretry: 10\nevent: a\ndata: one\ndata:two\ndata\n\ndata: last"
    assert list(iter_events([stream])) == [("a", b"one\ntwo\n"), (None, b"last")]
    assert list(iter_events([b"\n\n\n: only a comment\n\n"])) == []
    spaced = b"event: e\ndata:  two spaces \n\ndata:  one line \n\n"  # only the first space goes
    assert list(iter_events([spaced])) == [("e", b" two spaces "), (None, b" one line ")]


def _typed_anthropic(raw: bytes) -> StreamAccumulator:
    """The old path: the SDK's SSE decoding, one JSON object per event, fed through `RawEvent`."""
    from stepq.providers.anthropic.stream import RawEvent

    acc = StreamAccumulator(lambda d: None)
    for sse in SSEDecoder().iter_bytes(iter([raw])):
        if sse.event not in (None, "ping") and sse.data:
            acc.feed(RawEvent(json.loads(sse.data)))
    return acc


def test_anthropic_reader_builds_the_typed_paths_output(captures: dict[str, bytes]) -> None:
    raw = captures["anthropic"]
    deltas: list[Delta] = []
    acc = StreamAccumulator(deltas.append)
    assert read_anthropic([raw[i : i + 3] for i in range(0, len(raw), 3)], acc, lambda: False, "A", "hint") is False
    assert acc.complete
    out = acc.output()
    assert out == _typed_anthropic(raw).output()
    assert out.finish_reason == FinishReason.TOOL_CALLS
    assert out.message.tool_calls[0].args == {"q": "x"}
    assert out.message.parts[0].signature == "sig=="  # type: ignore[union-attr]
    assert [(d.kind, d.text) for d in deltas] == [
        ("reasoning", "let me "),
        ("reasoning", "think"),
        ("text", "Hello"),
        ("text", ", wörld ✓"),
        ("tool-input", '{"q"'),  # the call's argument pieces, as the wire sent them
        ("tool-input", ': "x"}'),
    ]
    assert out.usage.reasoning_tokens == 3


def test_anthropic_reader_stops_when_asked(captures: dict[str, bytes]) -> None:
    acc = StreamAccumulator(lambda d: None)
    assert read_anthropic([captures["anthropic"]], acc, lambda: True, "A", "hint") is True
    assert not acc.complete


def test_anthropic_error_event_is_classified() -> None:
    events = [fa.message_start(10, None, None), fa.error_event("overloaded_error", "busy now")]
    raw = anthropic_capture(fa.SSEReply(events))
    with pytest.raises(ProviderError) as caught:
        read_anthropic([raw], StreamAccumulator(lambda d: None), lambda: False, "Anthropic", "hint")
    assert caught.value.retryable and caught.value.code == "overloaded_error"
    assert "busy now" in caught.value.message
    raw = anthropic_capture(fa.SSEReply([fa.error_event("invalid_request_error", "bad field")]))
    with pytest.raises(ProviderError) as caught:
        read_anthropic([raw], StreamAccumulator(lambda d: None), lambda: False, "Anthropic", "hint")
    assert not caught.value.retryable and caught.value.status == 400


def _typed_openai(raw: bytes, acc: Any, chat: bool) -> None:
    """The old path: the SDK's typed stream over the same bytes."""
    client = openai.OpenAI(api_key="k", base_url="http://fake.invalid/v1")
    if chat:
        from openai.types.chat import ChatCompletionChunk as cast_to
    else:
        from openai.types.responses import ResponseStreamEvent as cast_to  # type: ignore[assignment]
    response = httpx.Response(200, content=raw, request=httpx.Request("POST", "http://fake.invalid"))
    for event in openai.Stream(cast_to=cast_to, response=response, client=client):  # type: ignore[arg-type]
        acc.feed(event)


@pytest.mark.parametrize("chat", [False, True])
def test_openai_reader_builds_the_typed_paths_output(captures: dict[str, bytes], chat: bool) -> None:
    raw = captures["chat" if chat else "responses"]
    kind = ChatAccumulator if chat else ResponsesAccumulator
    deltas: list[Delta] = []
    lean = kind(deltas.append, False, 0)
    assert read_openai([raw[i : i + 5] for i in range(0, len(raw), 5)], lean, lambda: False, "OpenAI") is False
    typed = kind(lambda d: None, False, 0)
    _typed_openai(raw, typed, chat)
    assert lean.complete and typed.complete
    assert lean.output() == typed.output()
    assert lean.output().message.parts[0].text == "Hi there"  # type: ignore[union-attr]
    assert [d.text for d in deltas] == ["Hi ", "there"]


def test_openai_tool_call_chunks_without_content_assemble() -> None:
    reply = fo.chat_stream(fo.chat_tool_call("call_1", "lookup", ['{"q"', ": 1}"]), finish="tool_calls")
    raw = openai_capture(reply, "/v1/chat/completions")
    acc = ChatAccumulator(lambda d: None, False, 0)
    read_openai([raw], acc, lambda: False, "OpenAI")
    out = acc.output()
    assert out.finish_reason == FinishReason.TOOL_CALLS
    assert [(c.id, c.name, c.args) for c in out.message.tool_calls] == [("call_1", "lookup", {"q": 1})]
    assert out.usage.input_tokens == 10


def test_openai_error_chunk_is_classified() -> None:
    reply = fo.SSEReply(
        [fo.chunk({"content": "a"}), fo.chat_error("slow down", code="rate_limit_exceeded")], named=False
    )
    raw = openai_capture(reply, "/v1/chat/completions")
    with pytest.raises(ProviderError) as caught:
        read_openai([raw], ChatAccumulator(lambda d: None, False, 0), lambda: False, "OpenAI")
    assert caught.value.retryable and caught.value.code == "rate_limit_exceeded"
    reply = fo.SSEReply([fo.chat_error("bad", error_type="invalid_request_error", code="invalid_value")], named=False)
    raw = openai_capture(reply, "/v1/chat/completions")
    with pytest.raises(ProviderError) as caught:
        read_openai([raw], ChatAccumulator(lambda d: None, False, 0), lambda: False, "OpenAI")
    assert not caught.value.retryable and "bad" in caught.value.message
