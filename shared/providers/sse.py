"""A lean Server-Sent Events decoder: raw body bytes in, `(event name, data bytes)` out.

The official SDKs still make the request (auth, base URL, headers, timeouts, status errors); the adapters
read the response's raw bytes through this instead of the SDK's stream, which builds a line list, a
`ServerSentEvent` and a typed (or wrapped) object per event: that was most of a streamed delta's CPU. It
splits on blank lines with `bytes.find` and only looks at the `event:` and `data:` fields (what the
providers send; `id:`, `retry:` and comments are dropped), per the WHATWG event-stream rules: CRLF, CR and
LF all end a line, one leading space after the colon is dropped, several `data:` lines join with "\\n".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

SSEvent = tuple[str | None, bytes]  # (the `event:` field or None, the joined `data:` lines)


def _parse_block(block: bytes) -> SSEvent | None:
    """One event's lines (LF-separated, no blank line inside) -> (event, data); None when it has no field."""
    if block.startswith(b"data: ") and b"\n" not in block:  # the common one-line event without a name
        return None, block[6:]
    event: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        name, colon, value = line.partition(b":")
        if not colon or not name:  # a field with no value is ignored here; a leading colon is a comment
            if not colon and name == b"data":
                data.append(b"")
            continue
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode()
    if event is None and not data:
        return None
    return event, b"\n".join(data)


class SSEDecoder:
    """Events out of a byte stream fed in chunks cut anywhere (pushed: the provider loop feeds it)."""

    __slots__ = ("_buf", "_carry_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._carry_cr = False  # the previous chunk ended in CR: a LF opening this one belongs to it

    def feed(self, chunk: bytes) -> list[SSEvent]:
        """Every event this chunk completes, in order."""
        if self._carry_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._carry_cr = False
        if b"\r" in chunk:
            self._carry_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        events: list[SSEvent] = []
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            block = buf[start:end]
            start = end + 2
            if block:
                parsed = _parse_block(block.lstrip(b"\n"))
                if parsed is not None:
                    events.append(parsed)
        buf = buf[start:] if start else buf
        self._buf = buf.lstrip(b"\n") if buf[:1] == b"\n" else buf
        return events

    def close(self) -> list[SSEvent]:
        """The stream ended: a trailing event without its blank line is still dispatched (as the SDKs do)."""
        tail, self._buf = self._buf.strip(b"\n"), b""
        parsed = _parse_block(tail) if tail else None
        return [parsed] if parsed is not None else []


def iter_events(chunks: Iterable[bytes]) -> Iterator[SSEvent]:
    """Every complete event in a byte stream cut anywhere (pulled: a thread reads the body)."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()
