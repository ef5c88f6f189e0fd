"""Tenant provider credentials in Redis: one hash per tenant (provider -> sealed record), never a key in clear.

A record is either a key encrypted with the fleet's key-encryption key (STEPQ_CREDENTIALS_KEY, a Fernet key:
AES-128-CBC with an HMAC-SHA256, from `cryptography`), or a reference to a secret the workers hold themselves
(`env:NAME`, `file:/path`), so the key never reaches Redis at all. Every change is one Lua call that writes the
hash and bumps the tenant policies' version counter (same slot), which each step reads with its lease: a
rotated key is used from the next step of every running turn, with no restart and no extra round trip per step
(`PolicyStore.at_version` reads the tenant's credentials with its policy when the version moved).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from stepq.errors import ConfigurationError, MissingExtraError, StepqError
from stepq.store.keys import Keys

# KEYS: the tenant's credentials hash, the policies' version. ARGV: provider, record JSON ('' = remove).
_WRITE = """
if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return redis.call('INCR', KEYS[2])
"""

SECRET_REF = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+)$")
KEK_VARIABLE = "STEPQ_CREDENTIALS_KEY"
NEW_KEK_COMMAND = "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"


class CredentialError(StepqError):
    """A tenant credential cannot be stored or used (no key-encryption key, a missing secret, a wrong KEK)."""


@dataclass(frozen=True)
class Sealed:
    """A stored record as Redis holds it: an encrypted key or a secret reference, with its fingerprint."""

    provider: str
    kind: str  # encrypted | secret
    value: str  # the Fernet token, or the reference (`env:NAME`, `file:/path`)
    fingerprint: str  # sha256 of the key, first 12 hex (encrypted), for `stepq tenant-key show` and rotation checks
    updated_at: float

    def dump(self) -> str:
        return json.dumps(
            {"kind": self.kind, "value": self.value, "fingerprint": self.fingerprint, "updated_at": self.updated_at}
        )

    @staticmethod
    def load(provider: str, raw: str) -> Sealed:
        data = json.loads(raw)
        return Sealed(provider, data["kind"], data["value"], data.get("fingerprint", ""), data.get("updated_at", 0.0))


def fingerprint(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


def _fernet(keks: list[str]) -> Any:
    try:
        from cryptography.fernet import Fernet, MultiFernet
    except ModuleNotFoundError:
        raise MissingExtraError("tenant API keys", "tenant-keys") from None
    try:
        return MultiFernet([Fernet(k.encode()) for k in keks])
    except ValueError:
        raise ConfigurationError(
            f"{KEK_VARIABLE} is not a Fernet key (32 url-safe base64 bytes); make one with: {NEW_KEK_COMMAND}"
        ) from None


def seal(provider: str, api_key: str, keks: list[str]) -> Sealed:
    """An API key encrypted under the first key-encryption key; CredentialError when none is set."""
    if not keks:
        raise CredentialError(
            f"{KEK_VARIABLE} is not set: a tenant key is stored encrypted with it ({NEW_KEK_COMMAND})"
        )
    token = _fernet(keks).encrypt(api_key.encode()).decode()
    return Sealed(provider, "encrypted", token, fingerprint(api_key), time.time())


def reference(provider: str, ref: str) -> Sealed:
    if not SECRET_REF.match(ref):
        raise CredentialError(f"secret reference {ref!r} must be env:NAME or file:/absolute/path")
    return Sealed(provider, "secret", ref, "", time.time())


def unseal(sealed: Sealed, keks: list[str], tenant: str) -> str:
    """The API key a record stands for, read on the worker; CredentialError naming what is missing (never the key)."""
    what = f"tenant {tenant}'s {sealed.provider} key"
    if sealed.kind == "secret":
        kind, _, name = sealed.value.partition(":")
        if kind == "env":
            value = os.environ.get(name, "")
            if not value:
                raise CredentialError(f"{what} names ${name}, which is not set on this worker")
            return value
        try:
            return Path(name).read_text().strip()
        except OSError as exc:
            raise CredentialError(f"{what} names file {name}, which this worker cannot read ({exc.strerror})") from None
    if not keks:
        raise CredentialError(f"{what} is encrypted, and this worker has no {KEK_VARIABLE} to open it")
    from cryptography.fernet import InvalidToken

    try:
        return str(_fernet(keks).decrypt(sealed.value.encode()).decode())
    except InvalidToken:
        raise CredentialError(
            f"{what} does not open with this worker's {KEK_VARIABLE} (another key sealed it)"
        ) from None


class CredentialStore:
    """Writes tenants' sealed credentials; workers read them with the tenant's policy (`PolicyStore`)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._write = client.register_script(_WRITE)

    def put(self, tenant: str, sealed: Sealed) -> int:
        """Store (or replace: rotate) one provider's record; returns the new policy version."""
        return int(
            self._write(
                keys=[self.keys.credentials(tenant), self.keys.policy_version], args=[sealed.provider, sealed.dump()]
            )
        )

    def remove(self, tenant: str, provider: str) -> int:
        return int(self._write(keys=[self.keys.credentials(tenant), self.keys.policy_version], args=[provider, ""]))

    def get(self, tenant: str) -> dict[str, Sealed]:
        raw = self.client.hgetall(self.keys.credentials(tenant))
        return parse(raw)


def parse(raw: dict[Any, Any]) -> dict[str, Sealed]:
    """A credentials hash as read (bytes or text) by provider."""
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
    return {text(p): Sealed.load(text(p), text(v)) for p, v in raw.items()}
