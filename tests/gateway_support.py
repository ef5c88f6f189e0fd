"""Helpers for the gateway tests: a real uvicorn serving the app on a free port, credentials, an SSE reader."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import rsa

from stepq.config.settings import Settings
from stepq.producer.gateway.app import create_app
from stepq.producer.gateway.auth import AuthConfig

TIMEOUT = 60.0
JWT_SECRET = "gateway-test-jwt-secret-of-32-bytes!"
KEYS = {  # plaintext key -> (tenant, subject, scopes); the gateway is only given their hashes
    "k-acme-all": ("acme", "alice", ["submit", "read", "approve"]),
    "k-acme-read": ("acme", "reader", ["read"]),
    "k-acme-submit": ("acme", "bot", ["submit", "read"]),
    "k-globex-all": ("globex", "gina", ["submit", "read", "approve"]),
}
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def api_keys_setting() -> list[dict[str, Any]]:
    return [
        {"sha256": hashlib.sha256(key.encode()).hexdigest(), "tenant": t, "subject": s, "scopes": scopes}
        for key, (t, s, scopes) in KEYS.items()
    ]


def write_jwks(path: Path) -> str:
    """A JWKS file holding RSA_KEY's public half as kid `test-rsa`; returns its path."""
    numbers = RSA_KEY.public_key().public_numbers()

    def b64(n: int) -> str:
        raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    jwk = {"kty": "RSA", "kid": "test-rsa", "use": "sig", "alg": "RS256", "n": b64(numbers.n), "e": b64(numbers.e)}
    path.write_text(json.dumps({"keys": [jwk]}))
    return str(path)


def hs256(tenant: str, sub: str, scope: str, exp_in: float = 300) -> str:
    claims = {"sub": sub, "tenant": tenant, "scope": scope, "exp": int(time.time() + exp_in)}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def rs256(tenant: str, sub: str, scope: str, exp_in: float = 300, kid: str = "test-rsa") -> str:
    claims = {"sub": sub, "tenant": tenant, "scope": scope, "exp": int(time.time() + exp_in)}
    return jwt.encode(claims, RSA_KEY, algorithm="RS256", headers={"kid": kid})


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


@dataclass
class Served:
    url: str
    settings: Settings
    server: uvicorn.Server

    def client(self, credential: str | None = "k-acme-all", **kwargs: Any) -> httpx.Client:
        headers = bearer(credential) if credential else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT, **kwargs)


@contextmanager
def serve(settings: Settings, auth: AuthConfig | None = None) -> Iterator[Served]:
    """The gateway app on a real uvicorn, on a free port, in a thread of this process."""
    app = create_app(settings, auth or AuthConfig.from_settings(settings))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:  # no event to wait on: uvicorn only sets this flag
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{port}", settings, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@dataclass
class SseEvent:
    id: int
    event: str
    data: dict[str, Any]


def sse_events(response: httpx.Response, comments: list[str] | None = None) -> Iterator[SseEvent]:
    """Parse a text/event-stream response into events (comments go into `comments` if given)."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            if comments is not None:
                comments.append(line[1:].strip())
            continue
        if not line:
            if fields:
                yield SseEvent(int(fields["id"]), fields["event"], json.loads(fields["data"]))
                fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value


def submit(http: httpx.Client, agent: str, prompt: str, **extra: Any) -> str:
    response = http.post("/v1/turns", json={"agent": agent, "prompt": prompt, **extra})
    assert response.status_code == 201, response.text
    return str(response.json()["turn_id"])
