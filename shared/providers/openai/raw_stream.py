"""Reads a Responses or Chat Completions stream's raw SSE bytes (the lean path): the SDK's request, our decoding.

The SDK's `Stream` rules, kept: `data: [DONE]` ends the stream, a chunk whose top-level `error` is set is
the in-stream failure (classified as `in_stream_error`, as the SDK's `APIError` would be), every other
event's data is one JSON object, read by the accumulators through `Lenient` (attribute access, None for a
field the server left out, as the SDK's typed models give).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stepq import jsonsafe
from stepq.providers.base import ProviderError, ShouldStop
from stepq.providers.openai.stream import ChatAccumulator, ResponsesAccumulator, in_stream_error
from stepq.providers.raw_body import pull
from stepq.providers.sse import SSEDecoder, SSEvent

STREAM_ERROR = "An error occurred during streaming"  # the SDK's message when the error object has none


class Lenient(dict[str, Any]):
    """A JSON object read like the SDK's typed event: `obj.field`, None when absent, nested objects wrapped."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        value = self.get(name)
        if type(value) is dict:
            return Lenient(value)
        if type(value) is list:
            return [Lenient(v) if type(v) is dict else v for v in value]
        return value


def chunk_error(error: Any, label: str) -> ProviderError:
    """A chunk's top-level `error` object -> the in-stream error the typed path raises for it."""
    code = message = None
    if isinstance(error, dict):
        raw_code = error.get("code") or error.get("type")
        code = str(raw_code) if raw_code is not None else None
        message = error.get("message")
    if not isinstance(message, str) or not message:
        message = STREAM_ERROR
    return in_stream_error(code, message, label)


class EventsReader:
    """A Responses or Chat Completions stream's reader, fed body chunks as they arrive (on the provider loop,
    or pulled by `read_stream`); `feed` and `end` answer True when `should_stop` ended the read early."""

    def __init__(self, acc: ResponsesAccumulator | ChatAccumulator, should_stop: ShouldStop, label: str) -> None:
        self._sse = SSEDecoder()
        self._acc = acc
        self._should_stop = should_stop
        self._label = label
        self._done = False  # `data: [DONE]` arrived: whatever follows is not read

    def feed(self, chunk: bytes) -> bool:
        return self._read(self._sse.feed(chunk))

    def end(self) -> bool:
        return self._read(self._sse.close())

    def _read(self, events: list[SSEvent]) -> bool:
        if self._done:
            return False
        acc = self._acc
        for _, data in events:
            if data.startswith(b"[DONE]"):
                self._done = True
                return False
            body = jsonsafe.loads(data)
            if type(body) is dict:
                if body.get("error"):
                    raise chunk_error(body["error"], self._label)
                acc.feed(Lenient(body))
            if self._should_stop():
                return True
        return False


def read_stream(
    chunks: Iterable[bytes], acc: ResponsesAccumulator | ChatAccumulator, should_stop: ShouldStop, label: str
) -> bool:
    """Feed every event of a pulled body to `acc`; True when `should_stop` ended the read early."""
    return pull(chunks, EventsReader(acc, should_stop, label))
