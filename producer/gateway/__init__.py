"""The HTTP/SSE gateway behind `stepq serve`: an async ASGI app that validates, stores and enqueues turns
exactly like `Client`, streams their events from Redis, and never calls a model.

Build it with `stepq.producer.gateway.app.create_app(settings, auth_config)`; routers take the caller
from `stepq.producer.gateway.auth.require(scope)`.
"""
