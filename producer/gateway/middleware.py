"""Pure ASGI middleware: the request body size limit and request counting (both see every request,
streaming responses included, without buffering them)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stepq.producer.gateway.errors import error_response
from stepq.producer.gateway.metrics import GatewayMetrics


class BodyLimit:
    """413 for a body over `max_bytes`: at once from Content-Length, or while a chunked body is read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"the request body is over the {self.max_bytes}-byte limit (STEPQ_GATEWAY_MAX_BODY_BYTES)"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await error_response(413, "too-large", message)(scope, receive, send)
            return
        seen = 0
        refused = False

        async def limited() -> Message:
            # a chunked body over the limit: answer 413 here, and tell the app the client went away
            # (raising instead would reach the app's body parser, which reports any failure as a 400)
            nonlocal seen, refused
            msg = await receive()
            if msg["type"] == "http.request" and not refused:
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    await error_response(413, "too-large", message)(scope, receive, send)
                    return {"type": "http.disconnect"}
            return msg

        async def guarded(msg: Message) -> None:
            if not refused:  # after our 413, whatever the app answers is dropped
                await send(msg)

        await self.app(scope, limited, guarded)


class CountRequests:
    """stepq_gateway_requests_total by route template (not raw path: ids would explode the label set)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def recording(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, recording)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(template, scope["method"], str(status)).inc()
