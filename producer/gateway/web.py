"""The web chat page at `/`: one HTML file, one ES module and a stylesheet shipped in the package.

No build step and nothing from a CDN, so it works offline. It uses the same endpoints as any client
(POST /v1/chat, GET /v1/chat/{id}/stream and /messages, GET /v1/agents) with the key the user enters.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from stepq.producer.gateway.errors import GatewayError

router = APIRouter(include_in_schema=False)

_TYPES = {"chat.js": "text/javascript; charset=utf-8", "chat.css": "text/css; charset=utf-8"}


@cache
def _asset(name: str) -> bytes:
    return (files("stepq.producer") / "web" / name).read_bytes()


@router.get("/")
async def page() -> Response:
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8", headers={"cache-control": "no-cache"})


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    if name not in _TYPES:
        raise GatewayError(404, "not-found", f"no asset {name!r}")
    return Response(_asset(name), media_type=_TYPES[name], headers={"cache-control": "no-cache"})
