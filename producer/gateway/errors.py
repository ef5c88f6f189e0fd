"""One JSON error shape for every failure: `{"error": {"code": ..., "message": ...}}`.

Validation errors, unknown routes, wrong methods and unexpected exceptions all answer in it; an
unexpected exception is logged server-side and answers a 500 with no traceback in the body.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from stepq.errors import (
    ApprovalError,
    AttachmentError,
    ContextError,
    PolicyError,
    QuotaExceededError,
    StepqError,
    StoreUnavailableError,
    SubmitError,
    ThreadBusyError,
    ThreadNotFoundError,
    ToolResultsError,
    ToolResultsRefusal,
    TranscriptError,
    TurnNotFoundError,
)

log = logging.getLogger("stepq.gateway")
JSON_CONTENT_TYPE = "Content-Type: application/json"

_HTTP_CODES = {
    400: "bad-request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "too-large",
    415: "unsupported-media-type",
    422: "invalid-request",
    429: "rate-limited",
    503: "unavailable",
}


REDIS_DOWN = "Redis is not reachable right now; retry shortly"
RETRY_AFTER = {"Retry-After": "1"}  # on a 503: Redis is down, and the gateway checks it again every second

# a result the body got wrong is a 422; one the turn's state refuses (answered, expired, not waiting) a 409
_TOOL_RESULTS_STATUS = {
    ToolResultsRefusal.UNKNOWN_CALL: 422,
    ToolResultsRefusal.MISSING: 422,
    ToolResultsRefusal.INVALID: 422,
}


class GatewayError(Exception):
    """An error answered as JSON with this status and code. `headers` go on the response (WWW-Authenticate…)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def from_stepq(exc: StepqError) -> GatewayError:
    """The HTTP answer for an error the library raised on purpose."""
    if isinstance(exc, StoreUnavailableError):  # Redis, not the request: retry later (its address stays in the log)
        log.warning("Redis unavailable: %s", exc)
        return GatewayError(503, "unavailable", REDIS_DOWN, RETRY_AFTER)
    if isinstance(exc, TurnNotFoundError | ThreadNotFoundError):
        return GatewayError(404, "not-found", str(exc))
    if isinstance(exc, ThreadBusyError):
        return GatewayError(409, "thread-busy", str(exc))
    if isinstance(exc, TranscriptError):
        return GatewayError(422, "invalid-transcript", str(exc))
    if isinstance(exc, ToolResultsError):
        return GatewayError(_TOOL_RESULTS_STATUS.get(exc.code, 409), exc.code.value, str(exc))
    if isinstance(exc, AttachmentError) and exc.unsupported_type:
        return GatewayError(415, "unsupported-media-type", str(exc))
    if isinstance(exc, QuotaExceededError):  # spent until the window resets: come back then
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return GatewayError(429, "quota-exceeded", str(exc), {"Retry-After": retry})
    if isinstance(exc, ContextError):  # the body parsed, but its context is not the agent's schema
        return GatewayError(422, "invalid-context", str(exc))
    if isinstance(exc, PolicyError):  # the request is well-formed; a policy does not allow it
        return GatewayError(403, "policy", str(exc))
    if isinstance(exc, SubmitError):
        return GatewayError(400, _code_of(exc), str(exc))
    if isinstance(exc, ApprovalError):
        return GatewayError(409, exc.code.value, str(exc))
    return GatewayError(400, _code_of(exc), str(exc))


def _code_of(exc: Exception) -> str:
    """`UnknownAgentError` -> `unknown-agent`: a stable code a caller can switch on."""
    name = type(exc).__name__.removesuffix("Error") or "error"
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name).lstrip("-")


def _validation_message(exc: RequestValidationError) -> str:
    """The first problem in words a caller understands, not pydantic's ("Input should be a valid dictionary…")."""
    first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return _bad_json(exc.body, first)
    if loc == ("body",):  # the body as a whole: absent, not JSON at all, or JSON but not an object
        return _bad_body(first)
    where = ".".join(str(part) for part in loc if part != "body")
    return f"{first.get('msg', 'invalid request')}" + (f" at {where}" if where else "")


def _bad_json(document: object, error: dict[str, Any]) -> str:
    """`the body is not valid JSON: Expecting value at line 1, column 10` (FastAPI gives a character offset)."""
    reason = str(error.get("ctx", {}).get("error", "malformed"))
    offset = error["loc"][1] if len(error["loc"]) > 1 and isinstance(error["loc"][1], int) else None
    if offset is None or not isinstance(document, str | bytes):
        return f"the body is not valid JSON: {reason}"
    text = document.decode("utf-8", "replace") if isinstance(document, bytes) else document
    before = text[:offset]
    line = before.count("\n") + 1
    column = offset - (before.rfind("\n") + 1) + 1
    return f"the body is not valid JSON: {reason} at line {line}, column {column}"


def _bad_body(error: dict[str, Any]) -> str:
    if error.get("type") == "missing":
        return f"the body is missing: send a JSON object ({JSON_CONTENT_TYPE})"
    if isinstance(error.get("input"), bytes | str):  # FastAPI hands a body it did not parse as JSON over raw
        return f"the body must be JSON ({JSON_CONTENT_TYPE})"
    return f"the body must be a JSON object, not {_json_kind(error.get('input'))}"


def _json_kind(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway(_: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(StepqError)
    async def _stepq(_: Request, exc: StepqError) -> JSONResponse:
        err = from_stepq(exc)
        return error_response(err.status, err.code, err.message, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid-request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        message = str(exc.detail) if exc.detail else code
        if exc.status_code == 404 and message == "Not Found":
            message = "no such route; see /docs for the API"
        elif exc.status_code == 405:
            message = "method not allowed on this route; see /docs for the API"
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(RedisError)
    async def _redis(request: Request, exc: RedisError) -> JSONResponse:
        log.warning("Redis error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
        return error_response(503, "unavailable", REDIS_DOWN, RETRY_AFTER)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal", "internal error; the gateway's log has the details")
