"""CPU per streamed delta of a provider stream's decoding: the SDK's stream against the lean SSE path, side by side.

The same wire bytes (one chunk per event, as a paced stream arrives) go through each side inside one process,
from an httpx2 response over those chunks to the accumulator (emit is a no-op), so the HTTP connection below
(socket, h11) is left out: it is the same for both. Sides:
  * anthropic, SDK `Stream[object]` + `RawEvent` (what main did before the lean path), and the typed
    `Stream[RawMessageStreamEvent]`;
  * anthropic, lean (`providers/anthropic/raw_stream.py`);
  * openai Responses and Chat Completions: the SDK's typed stream, and lean (`providers/openai/raw_stream.py`).
CPU is `time.process_time()` over `--deltas` deltas, best of `--repeat`; the ratio is lean / SDK.

    .venv/bin/python -m bench.stream_parsing
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from bench._common import positive_count, table
from stepq.providers.anthropic.raw_stream import read_stream as read_anthropic
from stepq.providers.anthropic.stream import RawEvent, StreamAccumulator
from stepq.providers.openai.raw_stream import read_stream as read_openai
from stepq.providers.openai.stream import ChatAccumulator, ResponsesAccumulator
from stepq.providers.raw_body import body_chunks


def _frame(event: dict[str, Any], named: bool = True) -> bytes:
    name = f"event: {event['type']}\n" if named else ""
    return f"{name}data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def anthropic_chunks(n: int) -> list[bytes]:
    text = "1712345678.123456|"
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "c",
                                              "content": [], "stop_reason": None, "stop_sequence": None,
                                              "usage": {"input_tokens": 10, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}} for _ in range(n)),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": n}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return [_frame(e) for e in events]


def responses_chunks(n: int) -> list[bytes]:
    item = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    base = {"id": "resp", "object": "response", "created_at": 1, "model": "g", "output": [], "status": "in_progress",
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
    done = {**base, "status": "completed",
            "usage": {"input_tokens": 1, "output_tokens": n, "total_tokens": n + 1,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}  # fmt: skip
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": base, "sequence_number": 0},
        {"type": "response.output_item.added", "output_index": 0, "item": item, "sequence_number": 1},
        *({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
           "delta": "1712345678.123456|", "logprobs": [], "sequence_number": 2 + i} for i in range(n)),
        {"type": "response.completed", "response": done, "sequence_number": n + 2},
    ]  # fmt: skip
    return [_frame(e) for e in events]


def chat_chunks(n: int) -> list[bytes]:
    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices, **extra}

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": "1712345678.123456|"}) for _ in range(n)]
    events += [chunk({}, "stop"), chunk(None, usage={"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n})]
    return [_frame(e, named=False) for e in events] + [b"data: [DONE]\n\n"]


def _response(chunks: list[bytes]) -> httpx2.Response:
    return httpx2.Response(
        200,
        content=iter(chunks),
        headers={"content-type": "text/event-stream"},
        request=httpx2.Request("POST", "http://x"),
    )


ANTHROPIC = anthropic.Anthropic(api_key="k", base_url="http://x")
OPENAI = openai.OpenAI(api_key="k", base_url="http://x")


def sdk_anthropic_object(chunks: list[bytes]) -> None:
    acc = StreamAccumulator(lambda d: None)
    for raw in anthropic.Stream(cast_to=object, response=_response(chunks), client=ANTHROPIC):
        acc.feed(RawEvent(raw) if type(raw) is dict else raw)
    assert acc.complete


def sdk_anthropic_typed(chunks: list[bytes]) -> None:
    acc = StreamAccumulator(lambda d: None)
    stream = anthropic.Stream(cast_to=RawMessageStreamEvent, response=_response(chunks), client=ANTHROPIC)  # type: ignore[arg-type]
    for event in stream:
        acc.feed(event)
    assert acc.complete


def lean_anthropic(chunks: list[bytes]) -> None:
    acc = StreamAccumulator(lambda d: None)
    read_anthropic(body_chunks(_response(chunks)), acc, lambda: False, "Anthropic", "")
    assert acc.complete


def sdk_openai(cast_to: Any, make: Callable[[], Any]) -> Callable[[list[bytes]], None]:
    def run(chunks: list[bytes]) -> None:
        acc = make()
        for event in openai.Stream(cast_to=cast_to, response=_response(chunks), client=OPENAI):
            acc.feed(event)
        assert acc.complete

    return run


def lean_openai(make: Callable[[], Any]) -> Callable[[list[bytes]], None]:
    def run(chunks: list[bytes]) -> None:
        acc = make()
        read_openai(body_chunks(_response(chunks)), acc, lambda: False, "OpenAI")
        assert acc.complete

    return run


def per_delta_us(fn: Callable[[list[bytes]], None], chunks: list[bytes], deltas: int, repeat: int) -> float:
    fn(chunks)  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn(chunks)
        best = min(best, time.process_time() - t0)
    return best / deltas * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=positive_count, default=5000)
    parser.add_argument("--repeat", type=positive_count, default=5)
    args = parser.parse_args(argv)
    n = args.deltas

    def responses() -> ResponsesAccumulator:
        return ResponsesAccumulator(lambda d: None, False, 0)

    def chat() -> ChatAccumulator:
        return ChatAccumulator(lambda d: None, False, 0)

    cases = [
        ("anthropic", "SDK Stream[object] + RawEvent (main)", sdk_anthropic_object, lean_anthropic, anthropic_chunks(n)),
        ("anthropic", "SDK typed events", sdk_anthropic_typed, lean_anthropic, anthropic_chunks(n)),
        ("openai responses", "SDK typed events (main)", sdk_openai(ResponseStreamEvent, responses),
         lean_openai(responses), responses_chunks(n)),
        ("openai chat", "SDK typed chunks (main)", sdk_openai(ChatCompletionChunk, chat), lean_openai(chat),
         chat_chunks(n)),
    ]  # fmt: skip
    rows = []
    for wire, sdk_name, sdk_fn, lean_fn, chunks in cases:
        sdk_us = per_delta_us(sdk_fn, chunks, n, args.repeat)
        lean_us = per_delta_us(lean_fn, chunks, n, args.repeat)
        rows.append([wire, sdk_name, f"{sdk_us:.1f}", f"{lean_us:.1f}", f"{lean_us / sdk_us:.2f}x"])
    print(f"CPU per delta decoding a stream of {n} text deltas, one chunk per event (best of {args.repeat}):\n")
    print(table(["wire", "SDK side", "SDK us/delta", "lean us/delta", "lean/SDK"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
