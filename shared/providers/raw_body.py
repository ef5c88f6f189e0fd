"""The body of an SDK's streamed response, read by a lean SSE reader (`providers.sse`).

The SDK made the request and checked its status. A body that arrives on the provider loop
(`loop_transport`) undecoded is *pumped*: the reader runs there, chunk by chunk, and the step's thread
only waits. Any other body is pulled by the thread through the cheapest iterator that still undoes a
`Content-Encoding` (the SSE endpoints send none, but a proxy may compress).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from stepq.providers.loop_transport import pumpable


class ChunkReader(Protocol):
    """An SSE reader fed body chunks; True from either method means the step stopped reading."""

    def feed(self, chunk: bytes) -> bool: ...

    def end(self) -> bool: ...


def body_chunks(http_response: Any) -> Iterator[bytes]:
    """The httpx (or httpx2) response's body as it arrives: raw bytes, or decoded when it is encoded."""
    encoding = http_response.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return iter(http_response.iter_raw())
    return iter(http_response.iter_bytes())


def pull(chunks: Iterable[bytes], reader: ChunkReader) -> bool:
    """Feed a pulled body to `reader`; True when it stopped early."""
    for chunk in chunks:
        if reader.feed(chunk):
            return True
    return reader.end()


def read_body(http_response: Any, reader: ChunkReader) -> bool:
    """Read the whole response through `reader`, on the provider loop when the body is there; True when the
    reader stopped early (the connection is then dropped, not reused)."""
    body = pumpable(http_response)
    if body is not None:
        return body.pump(reader.feed, reader.end)
    return pull(body_chunks(http_response), reader)
