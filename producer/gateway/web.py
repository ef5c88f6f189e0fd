"""The web pages: the chat page at `/` and the operator console at `/console`, plain HTML, ES modules and
stylesheets shipped in the package.

No build step at install time and nothing from a CDN, so they work offline. The two libraries they use
(marked for Markdown, DOMPurify to sanitize it) are vendored into `web/vendor/` by `make vendor-web`. The
pages use the same endpoints as any client (the chat routes, /v1/turns, /v1/approvals, /v1/agents) with
the key the user enters.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from stepq.producer.gateway.errors import GatewayError

router = APIRouter(include_in_schema=False)

_MEDIA = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
# what each URL folder may serve: (folder under web/, the file names allowed); nothing else is reachable
_FOLDERS = {
    "ui": ("", ("chat.js", "chat.css", "markdown.js")),
    "ui/vendor": ("vendor", ("marked.esm.js", "purify.es.mjs", "marked.LICENSE.txt", "purify.LICENSE.txt")),
    "console": ("console", ("console.js", "console.css", "api.js", "views.js", "timeline.js")),
}


@cache
def _asset(folder: str, name: str) -> bytes:
    base = files("stepq.producer") / "web"
    return (base / folder / name if folder else base / name).read_bytes()


def _serve(folder: str, name: str) -> Response:
    media = _MEDIA[name[name.rfind(".") :]]
    return Response(_asset(folder, name), media_type=media, headers={"cache-control": "no-cache"})


def _served(url_folder: str, name: str) -> Response:
    folder, names = _FOLDERS[url_folder]
    if name not in names:
        raise GatewayError(404, "not-found", f"no asset {name!r}")
    return _serve(folder, name)


@router.get("/")
async def page() -> Response:
    return _serve("", "index.html")


@router.get("/console")
async def console_page() -> Response:
    return _serve("console", "index.html")


@router.get("/ui/vendor/{name}")
async def vendored(name: str) -> Response:
    return _served("ui/vendor", name)


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    return _served("ui", name)


@router.get("/console/{name}")
async def console_asset(name: str) -> Response:
    return _served("console", name)
