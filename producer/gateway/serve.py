"""`stepq serve`: build the app from the environment's settings and run it on uvicorn."""

from __future__ import annotations

import logging
import sys

from stepq.config import Settings
from stepq.errors import MissingExtraError
from stepq.producer.gateway.auth import AuthConfig
from stepq.store.connection import first_contact

log = logging.getLogger("stepq.gateway")
DEMO_AGENTS = "stepq.demo_agents"


def _say(message: str) -> None:
    print(f"stepq serve: {message}", file=sys.stderr, flush=True)


def serve(settings: Settings, host: str | None = None, port: int | None = None, insecure_dev: bool = False) -> int:
    """Start the gateway; returns when uvicorn stops. A bad configuration is a one-line error (ConfigurationError),
    and so is a Redis that does not answer at start (redis-py's ConnectionError, which the CLI prints as one
    line naming the URL): a wrong STEPQ_REDIS_URL stops `stepq serve` within seconds instead of serving 503s."""
    try:
        import uvicorn

        from stepq.producer.gateway.app import create_app
    except ImportError:
        raise MissingExtraError("stepq serve", "gateway") from None
    if not settings.agent_modules:
        _say(f"no STEPQ_AGENT_MODULES set: serving the bundled demo agents ({DEMO_AGENTS})")
        settings = settings.model_copy(update={"agent_modules": [DEMO_AGENTS]})
    auth = AuthConfig.from_settings(settings, insecure_dev=insecure_dev)
    if not auth.configured and insecure_dev:
        _say("INSECURE DEV MODE: no API keys or JWT configured; every request is let in as tenant 'dev'")
    app = create_app(settings, auth)  # refuses to build without credentials unless insecure_dev
    first_contact(app.state.gateway.settings)  # the gateway's own (named) URL: its clients then count as reached
    uvicorn.run(
        app,
        host=host or settings.gateway_host,
        port=port if port is not None else settings.gateway_port,
        log_level="info",
        timeout_graceful_shutdown=5,
    )
    return 0
