"""`stepq serve`: build the app from the environment's settings and run it on uvicorn."""

from __future__ import annotations

import errno
import logging
import socket
import sys

from stepq.config.settings import GENERATED_SECRET_NOTICE, NEW_SECRET_COMMAND, Settings
from stepq.errors import ConfigurationError, MissingExtraError
from stepq.store.connection import first_contact

log = logging.getLogger("stepq.gateway")
DEMO_AGENTS = "stepq.agents.demo"
BACKLOG = 2048  # uvicorn's default


def _say(message: str) -> None:
    print(f"stepq serve: {message}", file=sys.stderr, flush=True)


def serve(settings: Settings, host: str | None = None, port: int | None = None, insecure_dev: bool = False) -> int:
    """Start the gateway; returns when uvicorn stops. A bad configuration is a one-line error (ConfigurationError),
    and so is a Redis that does not answer at start (redis-py's ConnectionError, which the CLI prints as one
    line naming the URL): a wrong STEPQ_REDIS_URL stops `stepq serve` within seconds instead of serving 503s."""
    try:  # the gateway extra (fastapi, uvicorn, pyjwt): its absence is one line naming it, not an ImportError
        import uvicorn

        from stepq.producer.gateway.app import create_app
        from stepq.producer.gateway.auth import AuthConfig
    except ImportError:
        raise MissingExtraError("stepq serve", "gateway") from None
    check_approval_secret(settings, insecure_dev)
    if not settings.agent_modules:
        _say(f"no STEPQ_AGENT_MODULES set: serving the bundled demo agents ({DEMO_AGENTS})")
        settings = settings.model_copy(update={"agent_modules": [DEMO_AGENTS]})
    auth = AuthConfig.from_settings(settings, insecure_dev=insecure_dev)
    if not auth.configured and insecure_dev:
        _say("INSECURE DEV MODE: no API keys or JWT configured; every request is let in as tenant 'dev'")
    app = create_app(settings, auth)  # refuses to build without credentials unless insecure_dev
    first_contact(app.state.gateway.settings)  # the gateway's own (named) URL: its clients then count as reached
    host = host or settings.gateway_host
    listener = listen(
        host,
        port if port is not None else settings.gateway_port,
        "--port or STEPQ_GATEWAY_PORT",
        "--host or STEPQ_GATEWAY_HOST",
    )
    bound = listener.getsockname()[1]
    _say(f"listening on http://{host}:{bound} (Ctrl-C stops)")  # connections wait in the backlog until it serves
    config = uvicorn.Config(app, host=host, port=bound, log_level="info", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[listener])
    return 0


def check_approval_secret(settings: Settings, insecure_dev: bool) -> None:
    """A gateway serves approvals to the network: tokens signed with a secret anyone reading Redis has are
    not good enough for that, so it refuses to start on the generated one (a development gateway says so)."""
    if settings.approval_secret is not None:
        return
    if insecure_dev:
        _say(GENERATED_SECRET_NOTICE)
    else:
        raise ConfigurationError(
            "STEPQ_APPROVAL_SECRET is not set, and `stepq serve` does not run on the generated secret kept in "
            f"Redis (anyone who can read Redis could forge approvals): {NEW_SECRET_COMMAND}, the same on the "
            "gateway and every worker (or pass --insecure-dev on a development machine)"
        )


def listen(host: str, port: int, port_flag: str, host_flag: str) -> socket.socket:
    """The listening socket, bound here so a taken port or a bad address is one line (ConfigurationError) that
    names the setting to change, not uvicorn's log and errno; uvicorn then serves on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = (exc.strerror or str(exc)).lower()
        taken = exc.errno in (errno.EADDRINUSE, errno.EACCES)  # else the address: unknown, or not this machine's
        fix = f"choose another port with {port_flag}" if taken else f"give an address of this machine with {host_flag}"
        raise ConfigurationError(f"cannot listen on {host}:{port}: {reason}; {fix}") from None
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock
