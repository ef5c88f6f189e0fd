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


def iter_events(chunks: Iterable[bytes]) -> Iterator[SSEvent]:
    """Every complete event in a byte stream cut anywhere; a trailing event without its blank line is
    still dispatched at the end (as the SDKs' decoders do)."""
    buf = b""
    carry_cr = False  # the previous chunk ended in CR: a LF opening this one belongs to it
    for chunk in chunks:
        if carry_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        carry_cr = False
        if b"\r" in chunk:
            carry_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = buf + chunk if buf else chunk
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            block = buf[start:end]
            start = end + 2
            if block:
                parsed = _parse_block(block.lstrip(b"\n"))
                if parsed is not None:
                    yield parsed
        buf = buf[start:] if start else buf
        buf = buf.lstrip(b"\n") if buf[:1] == b"\n" else buf
    tail = buf.strip(b"\n")
    if tail:
        parsed = _parse_block(tail)
        if parsed is not None:
            yield parsed
