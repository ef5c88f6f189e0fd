"""Tenant policies in Redis: one hash per tenant (scope -> Policy JSON) and a fleet-wide version counter.

Every change is one Lua call that compares the scope's current value, writes the new one, keeps the set of
tenants and bumps the version. Each step reads the version with its lease (store/turns.py), so a worker
reads a tenant's policy again only after some policy changed: a change reaches running turns at their next
step at no extra cost per step.
"""

from __future__ import annotations

import shlex
import threading
from typing import Any

import redis
from pydantic import ValidationError

from stepq.errors import StepqError
from stepq.models import Policy
from stepq.store import credentials
from stepq.store.credentials import Sealed
from stepq.store.keys import Keys

# KEYS: the tenant's hash, the version, the tenants set. ARGV: tenant, scope, expected JSON ('' = none), new
# JSON ('' = remove the scope). Returns the new version, or -1 when the scope changed since it was read.
_WRITE = """
local current = redis.call('HGET', KEYS[1], ARGV[2]) or ''
if current ~= ARGV[3] then return -1 end
if ARGV[4] == '' then redis.call('HDEL', KEYS[1], ARGV[2]) else redis.call('HSET', KEYS[1], ARGV[2], ARGV[4]) end
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[3], ARGV[1]) else redis.call('SADD', KEYS[3], ARGV[1]) end
return redis.call('INCR', KEYS[2])
"""

# KEYS: the tenant's hash, the version, the tenants set. ARGV: tenant.
_CLEAR = """
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[1])
return redis.call('INCR', KEYS[2])
"""

Document = dict[str, Policy]


class PolicyConflictError(StepqError):
    """A scope kept changing under a read-modify-write (another writer); the update was not applied."""


class StoredPolicyError(StepqError, ValueError):
    """A tenant's stored policy does not parse (written by an older stepq, or by hand); the message names the
    command that removes it."""


class PolicyStore:
    """Reads and writes tenant policies; `at_version` is the per-step read, cached until the version moves."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._write = client.register_script(_WRITE)
        self._clear = client.register_script(_CLEAR)
        self._cache: dict[str, tuple[int, Document]] = {}
        self._credentials: dict[str, dict[str, Sealed]] = {}  # read with the policy, at the cached version
        self._lock = threading.Lock()

    def _script_keys(self, tenant: str) -> list[str]:
        return [self.keys.policy(tenant), self.keys.policy_version, self.keys.policy_tenants]

    def get(self, tenant: str) -> Document:
        """The tenant's policy by scope, read now."""
        raw = self.client.hgetall(self.keys.policy(tenant))
        return {_text(scope): _parse(tenant, _text(scope), value) for scope, value in sorted(raw.items())}

    def at_version(self, tenant: str, version: int) -> Document:
        """The tenant's policy as of `version` (the counter a step read with its lease): no round trip while
        nothing changed since this process last read it."""
        with self._lock:
            cached = self._cache.get(tenant)
        if cached is not None and cached[0] == version:
            return cached[1]
        # may already be newer than `version`: the next step reads it again, harmless. The tenant's sealed
        # credentials come in the same round trip (their changes bump the same version).
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.policy(tenant))
        pipe.hgetall(self.keys.credentials(tenant))
        raw, sealed = pipe.execute()
        doc = {_text(scope): _parse(tenant, _text(scope), value) for scope, value in sorted(raw.items())}
        with self._lock:
            if len(self._cache) >= 4096:  # many tenants: start over rather than grow without bound
                self._cache, self._credentials = {}, {}
            self._cache[tenant] = (version, doc)
            self._credentials[tenant] = credentials.parse(sealed)
        return doc

    def credentials_at_version(self, tenant: str, version: int) -> dict[str, Sealed]:
        """The tenant's sealed provider credentials as of `version`, read with its policy (no round trip of
        their own; see `at_version`)."""
        self.at_version(tenant, version)
        with self._lock:
            return self._credentials.get(tenant, {})

    def update(self, tenant: str, scope: str, changes: dict[str, Any], unset: list[str] | None = None) -> Policy | None:
        """Merge `changes` into the scope's policy and drop the `unset` fields; None once nothing is left.
        Compare-and-set: a concurrent writer makes it read again (a few times, then PolicyConflictError)."""
        # removing every field does not parse what it removes: a scope that no longer parses can be cleared
        clearing = not changes and set(unset or []) >= set(Policy.model_fields)
        for _ in range(10):
            current = self.client.hget(self.keys.policy(tenant), scope)
            base = _parse(tenant, scope, current).model_dump(exclude_none=True) if current and not clearing else {}
            merged = {**base, **changes}
            for name in unset or []:
                merged.pop(name, None)
            policy = Policy.model_validate(merged)
            new = policy.model_dump_json(exclude_none=True)
            new = "" if new == "{}" else new
            written = self._write(keys=self._script_keys(tenant), args=[tenant, scope, _text(current or ""), new])
            if int(written) >= 0:
                return policy if new else None
        raise PolicyConflictError(f"tenant {tenant}'s policy ({scope}) kept changing under this update; run it again")

    def clear(self, tenant: str, scope: str | None = None) -> None:
        """Remove one scope of the tenant's policy, or (scope None) all of it."""
        if scope is None:
            self._clear(keys=self._script_keys(tenant), args=[tenant])
        else:
            self.update(tenant, scope, {}, unset=list(Policy.model_fields))

    def tenants(self) -> list[str]:
        return sorted(_text(t) for t in self.client.smembers(self.keys.policy_tenants))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(tenant: str, scope: str, raw: Any) -> Policy:
    try:
        return Policy.model_validate_json(raw)
    except ValidationError as exc:
        raise StoredPolicyError(
            f"tenant {tenant}'s stored policy ({scope}) is not a valid policy ({exc.errors()[0]['msg']}); "
            f"clear it with `stepq policy clear --tenant {tenant} --scope {shlex.quote(scope)}` and set it again"
        ) from None
