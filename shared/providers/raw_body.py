"""The body of an SDK's streamed response as raw byte chunks, for the lean SSE decoder (`providers.sse`).

The SDK made the request and checked its status; this only picks the cheapest iterator that still
undoes a `Content-Encoding` (the SSE endpoints send none, but a proxy may compress).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def body_chunks(http_response: Any) -> Iterator[bytes]:
    """The httpx (or httpx2) response's body as it arrives: raw bytes, or decoded when it is encoded."""
    encoding = http_response.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return iter(http_response.iter_raw())
    return iter(http_response.iter_bytes())
