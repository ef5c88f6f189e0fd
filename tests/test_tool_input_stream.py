"""Tool-call arguments stream as `tool-input` deltas on both decoding paths: the SDK's typed stream and the lean
raw-SSE reader, over the same wire bytes the fakes send (tests/fakes). Each provider's pieces join to the call's
final arguments; the output tool's pieces stay `object` deltas; a schema answer streams no tool input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from stepq.models import Delta, ToolInputDelta
from stepq.providers.anthropic.raw_stream import read_stream as read_anthropic
from stepq.providers.anthropic.stream import StreamAccumulator
from stepq.providers.base import OUTPUT_TOOL
from stepq.providers.bedrock.wire import StreamAssembler
from stepq.providers.openai.raw_stream import read_stream as read_openai
from stepq.providers.openai.stream import ChatAccumulator, ResponsesAccumulator
from stepq.providers.raw_body import body_chunks
from tests.fakes import anthropic_server as fa
from tests.fakes import openai_server as fo

PIECES = ['{"que', 'ry": "a lo', "ng argu", 'ment"}']
ARGS = {"query": "a long argument"}


def _response(frames: list[bytes]) -> httpx2.Response:
    return httpx2.Response(
        200,
        content=iter(frames),
        headers={"content-type": "text/event-stream"},
        request=httpx2.Request("POST", "http://x"),
    )


def _frames(reply: Any) -> list[bytes]:
    """The reply's bytes as the fake's handler writes them."""
    named = getattr(reply, "named", True)
    out = [
        (f"event: {e['type']}\n" if named and "type" in e else "").encode() + f"data: {json.dumps(e)}\n\n".encode()
        for e in reply.events
    ]
    return out + ([b"data: [DONE]\n\n"] if getattr(reply, "done", False) else [])


def _inputs(deltas: list[Delta]) -> dict[str, tuple[str, str]]:
    """call id -> (tool name, joined input pieces), checking every piece of a call names the same tool."""
    calls: dict[str, tuple[str, str]] = {}
    for d in deltas:
        if isinstance(d, ToolInputDelta):
            name, text = calls.get(d.call_id, (d.tool_name, ""))
            assert name == d.tool_name
            calls[d.call_id] = (name, text + d.text)
    return calls


ANTHROPIC = anthropic.Anthropic(api_key="k", base_url="http://x")
OPENAI = openai.OpenAI(api_key="k", base_url="http://x")


def _anthropic_typed(frames: list[bytes], emit: Callable[[Delta], None]) -> StreamAccumulator:
    acc = StreamAccumulator(emit)
    stream = anthropic.Stream(cast_to=RawMessageStreamEvent, response=_response(frames), client=ANTHROPIC)  # type: ignore[arg-type]
    for event in stream:
        acc.feed(event)
    return acc


def _anthropic_lean(frames: list[bytes], emit: Callable[[Delta], None]) -> StreamAccumulator:
    acc = StreamAccumulator(emit)
    read_anthropic(body_chunks(_response(frames)), acc, lambda: False, "Anthropic", "")
    return acc


@pytest.mark.parametrize("path", [_anthropic_typed, _anthropic_lean], ids=["typed", "lean"])
def test_anthropic_input_json_deltas_stream_per_call(path: Any) -> None:
    reply = fa.stream(
        fa.text_block(0, ["Let me look."]),
        fa.tool_use_block(1, "toolu_1", "lookup", PIECES),
        fa.tool_use_block(2, "toolu_2", "other", ["{", "}"]),
        stop_reason="tool_use",
    )
    deltas: list[Delta] = []
    acc = path(_frames(reply), deltas.append)
    calls = {c.id: c for c in acc.output().message.tool_calls}
    assert [d.text for d in deltas if isinstance(d, ToolInputDelta) and d.call_id == "toolu_1"] == PIECES
    assert _inputs(deltas) == {"toolu_1": ("lookup", json.dumps(ARGS)), "toolu_2": ("other", "{}")}
    assert json.loads(_inputs(deltas)["toolu_1"][1]) == calls["toolu_1"].args == ARGS
    assert [d.text for d in deltas if d.kind == "text"] == ["Let me look."]


@pytest.mark.parametrize("path", [_anthropic_typed, _anthropic_lean], ids=["typed", "lean"])
def test_anthropic_output_tool_streams_object_deltas_not_tool_input(path: Any) -> None:
    reply = fa.stream(fa.tool_use_block(0, "toolu_o", OUTPUT_TOOL, ['{"a"', ": 1}"]), stop_reason="tool_use")
    deltas: list[Delta] = []
    path(_frames(reply), deltas.append)
    assert [(d.kind, d.text) for d in deltas] == [("object", '{"a"'), ("object", ": 1}")]


def _openai_typed(cast_to: Any, acc: Any) -> Callable[[list[bytes]], Any]:
    def run(frames: list[bytes]) -> Any:
        for event in openai.Stream(cast_to=cast_to, response=_response(frames), client=OPENAI):
            acc.feed(event)
        return acc

    return run


def _openai_lean(acc: Any) -> Callable[[list[bytes]], Any]:
    def run(frames: list[bytes]) -> Any:
        read_openai(body_chunks(_response(frames)), acc, lambda: False, "OpenAI")
        return acc

    return run


@pytest.mark.parametrize("lean", [False, True], ids=["typed", "lean"])
def test_openai_responses_function_call_arguments_deltas_stream(lean: bool) -> None:
    deltas: list[Delta] = []
    acc = ResponsesAccumulator(deltas.append, False, 0)
    reply = fo.response_stream(fo.call_item("call_1", "lookup", PIECES))
    (_openai_lean(acc) if lean else _openai_typed(ResponseStreamEvent, acc))(_frames(reply))
    [call] = acc.output().message.tool_calls
    assert [d.text for d in deltas if isinstance(d, ToolInputDelta)] == PIECES
    assert _inputs(deltas) == {"call_1": ("lookup", json.dumps(ARGS))}
    assert call.id == "call_1" and call.args == ARGS


@pytest.mark.parametrize("lean", [False, True], ids=["typed", "lean"])
def test_chat_completions_tool_call_fragments_stream(lean: bool) -> None:
    deltas: list[Delta] = []
    acc = ChatAccumulator(deltas.append, False, 0)
    reply = fo.chat_stream(fo.chat_tool_call("call_c", "lookup", PIECES), finish="tool_calls")
    (_openai_lean(acc) if lean else _openai_typed(ChatCompletionChunk, acc))(_frames(reply))
    [call] = acc.output().message.tool_calls
    assert [d.text for d in deltas if isinstance(d, ToolInputDelta)] == PIECES
    assert _inputs(deltas) == {"call_c": ("lookup", json.dumps(ARGS))}
    assert call.args == ARGS


def test_chat_completions_schema_answer_streams_no_tool_input() -> None:
    """A JSON-schema answer drops tool calls from its output: their input must not stream either."""
    deltas: list[Delta] = []
    acc = ChatAccumulator(deltas.append, True, 0)
    reply = fo.chat_stream(fo.chat_tool_call("call_c", "lookup", PIECES), finish="tool_calls")
    _openai_lean(acc)(_frames(reply))
    assert not [d for d in deltas if isinstance(d, ToolInputDelta)]


def test_bedrock_tool_use_input_fragments_stream() -> None:
    """Converse stream events as boto3 yields them (the fake's event-stream frames, decoded)."""
    assembler = StreamAssembler()
    events = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockStart": {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "tu_1", "name": "lookup"}}}},
        *({"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"toolUse": {"input": p}}}} for p in PIECES),
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "tool_use"}},
    ]
    deltas = [d for e in events for d in assembler.on_event(e)]
    [call] = assembler.message().tool_calls
    assert [d.text for d in deltas] == PIECES
    assert _inputs(deltas) == {"tu_1": ("lookup", json.dumps(ARGS))}
    assert call.args == ARGS
