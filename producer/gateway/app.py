"""`create_app(settings, auth)`: the gateway's FastAPI app, its routers, middleware and error handlers."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import redis.asyncio as aioredis
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from stepq.config.settings import Settings
from stepq.errors import ConfigurationError
from stepq.producer.gateway import routes_approvals, routes_inspect, routes_meta, routes_tool_results, routes_turns
from stepq.producer.gateway.auth import AuthConfig
from stepq.producer.gateway.errors import install_error_handlers
from stepq.producer.gateway.limits import RequestLimiter
from stepq.producer.gateway.middleware import BodyLimit, CountRequests
from stepq.producer.gateway.service import Gateway
from stepq.producer.gateway.streams import StreamHub

# routers other modules of this package contribute when present (threads, the chat UI)
OPTIONAL_ROUTERS = ("stepq.producer.gateway.threads", "stepq.producer.gateway.chat", "stepq.producer.gateway.web")


def create_app(
    settings: Settings,
    auth: AuthConfig,
    *,
    hub_factory: Callable[[aioredis.Redis], StreamHub] | None = None,
    embedded: bool = False,
) -> FastAPI:
    """The app. Refuses (ConfigurationError) to build with no credentials configured unless `auth.insecure_dev`.
    `embedded` serves the in-process Redis stand-in when STEPQ_REDIS_URL is unset (`stepq demo --serve`,
    whose worker runs in the same process)."""
    if not auth.configured and not auth.insecure_dev:
        raise ConfigurationError(
            "no API keys or JWT settings configured: set STEPQ_API_KEYS (or STEPQ_API_KEYS_FILE, "
            "STEPQ_JWT_SECRET, STEPQ_JWT_JWKS_FILE), or pass --insecure-dev for a local trial"
        )
    gw = Gateway(settings, hub_factory, embedded=embedded)
    app = FastAPI(
        title="stepq gateway",
        version="1",
        description="Submit agent turns, stream their events (SSE), decide approvals.",
        lifespan=gw.lifespan,
    )
    app.state.gateway = gw
    app.state.auth = auth
    app.state.redis_health = gw.health  # read by every authenticated route (see auth.require)
    if gw.settings.gateway_rate_limit_rpm:
        app.state.request_limiter = RequestLimiter(gw, gw.settings.gateway_rate_limit_rpm)
    install_error_handlers(app)
    app.include_router(routes_turns.router)
    app.include_router(routes_tool_results.router)
    app.include_router(routes_approvals.router)
    app.include_router(routes_meta.router)
    app.include_router(routes_inspect.router)
    for name in OPTIONAL_ROUTERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        app.include_router(module.router)
    # outermost last: counting sees every answer, including a 413 from the body limit
    app.add_middleware(BodyLimit, max_bytes=gw.settings.gateway_max_body_bytes)
    if gw.settings.gateway_cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=gw.settings.gateway_cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
        )
    app.add_middleware(CountRequests, metrics=gw.metrics)
    return app
