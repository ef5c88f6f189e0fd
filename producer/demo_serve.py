"""`stepq demo --serve`: the web chat page on the bundled demo agents, in one process, offline.

The gateway, a worker and (with STEPQ_REDIS_URL unset) the in-process Redis stand-in all live here,
so a browser at the printed URL can chat with `demo.support`: streamed text, a looked-up order, a
refund that waits for the Approve button. No credentials are configured: every request is let in as
tenant `dev`, which is why it binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import socket
import sys

from stepq.config.settings import Settings, load_settings
from stepq.embedded import local_worker, with_demo_agents
from stepq.errors import MissingExtraError

DEMO_AGENT = "demo.support"


def serve_demo(settings: Settings | None = None, host: str = "127.0.0.1", port: int = 8000) -> int:
    """Run gateway + worker until interrupted; prints the chat page's URL once it is ready."""
    try:  # the gateway extra (FastAPI, uvicorn, pyjwt): imported only for --serve, named when missing
        import uvicorn

        from stepq.producer.gateway.app import create_app
        from stepq.producer.gateway.auth import AuthConfig
        from stepq.producer.gateway.serve import listen
    except ImportError:
        raise MissingExtraError("stepq demo --serve", "gateway") from None
    settings = with_demo_agents(settings or load_settings())
    if not settings.gateway_chat_agent:
        settings = settings.model_copy(update={"gateway_chat_agent": DEMO_AGENT})
    # before the worker starts: a taken port or a bad address is one line, with nothing to stop
    listener = listen(host, port, "--port", "--host")
    with local_worker(settings):
        app = create_app(settings, AuthConfig(insecure_dev=True), embedded=True)
        where = "state in this process (embedded)" if settings.embedded else f"state in Redis at {settings.redis_url}"

        class Announcing(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                if self.started:  # the bound port (port 0 picks a free one)
                    bound = self.servers[0].sockets[0].getsockname()[1]
                    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
                    print(f"stepq demo: chat with the demo agents at http://{shown}:{bound}/?agent={DEMO_AGENT}")
                    print(f"stepq demo: gateway and worker run in this process, {where}; Ctrl-C stops")
                    sys.stdout.flush()

        server = Announcing(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2))
        server.run(sockets=[listener])
    return 0 if server.started else 1


if __name__ == "__main__":  # pragma: no cover - `python -m stepq.producer.demo_serve`
    sys.exit(serve_demo())
