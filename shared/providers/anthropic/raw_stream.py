"""Reads a Messages stream's raw SSE bytes (the lean path): the SDK's request, our own decoding.

The same events the SDK's `Stream` would yield, with its rules: an event without an `event:` name and
`ping` are skipped, `event: error` is the in-stream error (classified as `in_stream_error`, as the SDK's
`APIStatusError` with status 200 would be), every other event's data is one JSON object. The hot event,
a `content_block_delta`, goes to the accumulator as a plain dict; the rest through `RawEvent`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from stepq import jsonsafe
from stepq.providers.anthropic.stream import RawEvent, StreamAccumulator, in_stream_error, scrub
from stepq.providers.base import ShouldStop
from stepq.providers.raw_body import pull
from stepq.providers.sse import SSEDecoder, SSEvent


def error_event(data: bytes, label: str, auth_hint: str) -> Exception:
    """`event: error`: its `error.type` and message, as the typed path classifies them."""
    text = data.decode("utf-8", "replace")
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    err_type = message = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err_type, message = body["error"].get("type"), body["error"].get("message")
    return in_stream_error(err_type, scrub(str(message or text or "Error code: 200")), label, auth_hint)


class MessagesReader:
    """The Messages stream's reader, fed body chunks as they arrive (on the provider loop, or pulled by
    `read_stream`); `feed` and `end` answer True when `should_stop` ended the read early."""

    def __init__(self, acc: StreamAccumulator, should_stop: ShouldStop, label: str, auth_hint: str) -> None:
        self._sse = SSEDecoder()
        self._acc = acc
        self._should_stop = should_stop
        self._label = label
        self._auth_hint = auth_hint

    def feed(self, chunk: bytes) -> bool:
        return self._read(self._sse.feed(chunk))

    def end(self) -> bool:
        return self._read(self._sse.close())

    def _read(self, events: list[SSEvent]) -> bool:
        acc = self._acc
        for event, data in events:
            if event is None or event == "ping":
                continue
            if event == "error":
                raise error_event(data, self._label, self._auth_hint)
            if not data:
                continue
            body = jsonsafe.loads(data)
            if event == "content_block_delta" and type(body) is dict:
                acc.block_delta(body["index"], body["delta"])
            else:
                acc.feed(RawEvent(body) if type(body) is dict else body)
            if self._should_stop():
                return True
        return False


def read_stream(
    chunks: Iterable[bytes], acc: StreamAccumulator, should_stop: ShouldStop, label: str, auth_hint: str
) -> bool:
    """Feed every event of a pulled body to `acc`; True when `should_stop` ended the read early."""
    return pull(chunks, MessagesReader(acc, should_stop, label, auth_hint))
