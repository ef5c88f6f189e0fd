"""Server-sent events encoding: `id: <seq>`, `event: <type>`, `data: <the event's JSON>`, and comments."""

from __future__ import annotations

from stepq.producer.gateway.streams import RawEvent

KEEPALIVE = b": keep-alive\n\n"


def encode(event: RawEvent) -> bytes:
    """One SSE frame; the data is the stored event JSON (one line), sent without re-serializing it."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {event.payload}\n\n".encode()


def encode_all(events: list[RawEvent]) -> bytes:
    """Several frames in one write: a stream that fell behind catches up in few sends."""
    return b"".join(encode(e) for e in events)


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()
