"""Who is calling: API keys (stored as SHA-256 hashes) and bearer JWTs (HS256 secret, RS256 via a JWKS
file) map to a `Principal {tenant, subject, scopes}`. Routers depend on `require(scope)`.

Credentials arrive as `Authorization: Bearer <key or JWT>` or `X-API-Key: <key>`. A token with two dots
is a JWT; anything else is an API key. No plaintext key is ever configured or kept: the operator gives
`sha256(key)` in hex (`printf %s "$KEY" | sha256sum`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stepq.config.settings import Settings
from stepq.errors import ConfigurationError
from stepq.models import Policy
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.health import RedisHealth

# `review`: see the approval inbox (GET /v1/approvals) without deciding; `approve` may see it too
SCOPES = frozenset({"submit", "read", "approve", "review"})


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. Every turn and thread it creates belongs to its tenant."""

    tenant: str
    subject: str
    scopes: frozenset[str] = field(default_factory=frozenset)
    policy: Policy | None = field(default=None, compare=False, hash=False)  # the caller layer of its turns

    def may(self, scope: str) -> bool:
        return scope in self.scopes


class ApiKeyEntry(BaseModel):
    """One configured key: `{"sha256": "<hex of sha256(key)>", "tenant", "subject", "scopes": [...]}`."""

    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str = Field(min_length=1)
    subject: str = Field(min_length=1)
    scopes: list[str] = Field(default_factory=lambda: sorted(SCOPES))
    policy: Policy | None = (
        None  # what this key's turns may do, tightening only (stepq.policy.resolution's caller layer)
    )

    @field_validator("scopes")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - SCOPES)
        if unknown:
            raise ValueError(f"unknown scopes {unknown}; known: {sorted(SCOPES)}")
        return value


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class AuthConfig:
    """What the gateway accepts. `insecure_dev` lets every request in as a full-scope `dev` principal."""

    api_keys: dict[str, Principal] = field(default_factory=dict)  # sha256 hex -> principal
    jwt_secret: bytes | None = None
    jwks: jwt.PyJWKSet | None = None
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    tenant_claim: str = "tenant"
    insecure_dev: bool = False

    @property
    def configured(self) -> bool:
        return bool(self.api_keys or self.jwt_secret or self.jwks)

    @classmethod
    def from_settings(cls, settings: Settings, insecure_dev: bool = False) -> AuthConfig:
        """Read keys and JWT settings; a malformed entry is a one-line ConfigurationError naming the variable."""
        entries = list(settings.api_keys)
        if settings.api_keys_file:
            entries += _read_json_list(settings.api_keys_file, "STEPQ_API_KEYS_FILE")
        keys: dict[str, Principal] = {}
        for index, raw in enumerate(entries):
            try:
                entry = ApiKeyEntry.model_validate(raw)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ConfigurationError(
                    f"STEPQ_API_KEYS entry {index}: {first['msg']} at {where or 'entry'}; "
                    'expected {"sha256": "<64 hex>", "tenant": "...", "subject": "...", "scopes": [...]}'
                ) from None
            keys[entry.sha256] = Principal(entry.tenant, entry.subject, frozenset(entry.scopes), entry.policy)
        jwks = None
        if settings.jwt_jwks_file:
            try:
                jwks = jwt.PyJWKSet.from_json(Path(settings.jwt_jwks_file).read_text())
            except (OSError, jwt.PyJWTError, ValueError) as exc:
                raise ConfigurationError(
                    f"STEPQ_JWT_JWKS_FILE={settings.jwt_jwks_file}: cannot load a JWKS: {exc}"
                ) from None
        secret = settings.jwt_secret.get_secret_value().encode() if settings.jwt_secret else None
        return cls(
            api_keys=keys,
            jwt_secret=secret,
            jwks=jwks,
            jwt_audience=settings.jwt_audience,
            jwt_issuer=settings.jwt_issuer,
            tenant_claim=settings.jwt_tenant_claim,
            insecure_dev=insecure_dev,
        )

    def authenticate(self, credential: str | None) -> Principal:
        """The principal for a presented credential, or a 401 GatewayError saying what is wrong."""
        if self.insecure_dev and not self.configured:
            return Principal("dev", "dev", SCOPES)
        if not credential:
            raise _unauthenticated("no credentials: send 'Authorization: Bearer <API key or JWT>'")
        if credential.count(".") == 2:
            return self._from_jwt(credential)
        digest = hash_key(credential)
        for stored, principal in self.api_keys.items():
            if hmac.compare_digest(stored, digest):
                return principal
        raise _unauthenticated("unknown API key")

    def _from_jwt(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _unauthenticated("malformed bearer token") from None
        alg = header.get("alg")
        key: Any
        if alg == "HS256" and self.jwt_secret is not None:
            key = self.jwt_secret
        elif alg == "RS256" and self.jwks is not None:
            kid = header.get("kid")
            matches = [k for k in self.jwks.keys if kid is None or k.key_id == kid]
            if not matches:
                raise _unauthenticated(f"no key {kid!r} in the configured JWKS")
            key = matches[0].key
        else:
            raise _unauthenticated(f"JWT algorithm {alg!r} is not accepted here")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.jwt_audience,
                issuer=self.jwt_issuer,
                options={"require": ["exp", "sub"], "verify_aud": self.jwt_audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise _unauthenticated("the JWT has expired") from None
        except jwt.PyJWTError as exc:
            raise _unauthenticated(f"invalid JWT: {exc}") from None
        tenant = claims.get(self.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise _unauthenticated(f"the JWT has no {self.tenant_claim!r} claim naming the tenant")
        return Principal(tenant, str(claims["sub"]), frozenset(_scopes(claims)) & SCOPES)


def _scopes(claims: dict[str, Any]) -> list[str]:
    """OAuth's space-separated `scope` string, or a `scopes` list."""
    if isinstance(claims.get("scope"), str):
        return claims["scope"].split()
    value = claims.get("scopes")
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


def _read_json_list(path: str, variable: str) -> list[Any]:
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{variable}={path}: cannot read a JSON list of keys: {exc}") from None
    if not isinstance(value, list):
        raise ConfigurationError(f"{variable}={path}: expected a JSON list of keys")
    return value


def _unauthenticated(message: str) -> GatewayError:
    return GatewayError(401, "unauthenticated", message, {"WWW-Authenticate": "Bearer"})


def credential_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("x-api-key") or None


def require(scope: str, *alternatives: str) -> Callable[[Request], Awaitable[Principal]]:
    """A FastAPI dependency: the caller's principal, which must hold `scope` or one of `alternatives` (401 / 403 /
    429 otherwise; 503 at once while the gateway knows Redis is down, since every route behind a credential
    needs it)."""
    accepted = (scope, *alternatives)
    for name in accepted:
        if name not in SCOPES:
            raise ValueError(f"unknown scope {name!r}; known: {sorted(SCOPES)}")

    async def dependency(request: Request) -> Principal:
        config: AuthConfig = request.app.state.auth
        principal = config.authenticate(credential_of(request))
        if not any(principal.may(name) for name in accepted):
            either = " or ".join(repr(name) for name in accepted)
            raise GatewayError(403, "forbidden", f"this credential lacks the {either} scope")
        health: RedisHealth | None = getattr(request.app.state, "redis_health", None)
        if health is not None:
            health.refuse_while_down()
        limiter = getattr(request.app.state, "request_limiter", None)
        if limiter is not None:
            await limiter.check(principal)
        return principal

    return dependency
