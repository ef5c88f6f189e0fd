"""Usage quota counters: one hash (`tokens`, `cost`) per tenant, quota scope and fixed window.

A step adds its usage (the same tokens and cost its trace row shows) with its commit: the counting script rides
the commit's round trip (StepEmitter.flush_with). Counters are read with the step's lease on a single Redis
(store/turns.py `_BEGIN`); a process that does not know yet which counters a turn checks, and a Redis Cluster
(the tenant's counters share their own slot), read them with `read` instead.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis

from stepq.models import Quota
from stepq.store.keys import Keys

# KEYS: counters. ARGV: tokens, cost (a decimal string), ttl seconds for each counter (same order as KEYS)
_COUNT = """
for i = 1, #KEYS do
  if tonumber(ARGV[1]) > 0 then redis.call('HINCRBY', KEYS[i], 'tokens', ARGV[1]) end
  if tonumber(ARGV[2]) > 0 then redis.call('HINCRBYFLOAT', KEYS[i], 'cost', ARGV[2]) end
  redis.call('EXPIRE', KEYS[i], ARGV[2 + i])
end
return 1
"""


@dataclass(frozen=True)
class Window:
    """One quota's current window: its counter, and when it ends."""

    scope: str
    quota: Quota
    label: str
    key: str
    resets_at: float

    @property
    def ttl_s(self) -> int:
        return int(self.resets_at - time.time() + self.quota.window_s) + 1


def window(keys: Keys, tenant: str, scope: str, quota: Quota, label: str, now: float) -> Window:
    index = int(now // quota.window_s)
    return Window(scope, quota, label, keys.quota(tenant, scope, quota.window_s, index), (index + 1) * quota.window_s)


def usage(raw: Any) -> tuple[int, float]:
    """A counter's `[tokens, cost]` as read (missing fields: nothing used)."""
    tokens, cost = raw if raw else (None, None)
    return int(tokens or 0), float(cost or 0.0)


class QuotaStore:
    """Reads and adds to quota counters; remembers per turn which counters its last step checked, so the next
    step of that turn here reads them with its lease."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.script = client.register_script(_COUNT)
        self._expected: OrderedDict[str, list[str]] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, keys: list[str]) -> dict[str, Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "tokens", "cost")
        return dict(zip(keys, pipe.execute(), strict=True))

    def count_args(self, windows: list[Window], tokens: int, cost: float) -> list[Any]:
        return [tokens, repr(float(cost)), *(w.ttl_s for w in windows)]

    def expected(self, turn_id: str) -> list[str]:
        with self._lock:
            return list(self._expected.get(turn_id, []))

    def expect(self, turn_id: str, keys: list[str]) -> None:
        with self._lock:
            if keys:
                self._expected[turn_id] = keys
                self._expected.move_to_end(turn_id)
                while len(self._expected) > 4096:
                    self._expected.popitem(last=False)
            else:
                self._expected.pop(turn_id, None)


@dataclass(frozen=True)
class Denial:
    """A spent quota: what a `quota-exceeded` event, a 429 and a failed turn say."""

    window: Window
    kind: str  # tokens | cost
    used: float
    limit: float

    @property
    def retry_after_s(self) -> float:
        return max(self.window.resets_at - time.time(), 0.0)

    @property
    def message(self) -> str:
        quota = self.window.quota
        used = f"{self.used:g}" if self.kind == "tokens" else f"{self.used:.4f}"
        resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.window.resets_at))
        return (
            f"quota-exceeded: {self.window.label} allows {self.limit:g} {self.kind} per {quota.window_s:g}s and "
            f"{used} are used; it resets at {resets} (in {self.retry_after_s:.0f}s)"
        )

    def event(self) -> dict[str, Any]:
        return {
            "scope": self.window.scope,
            "kind": self.kind,
            "used": self.used,
            "limit": self.limit,
            "window_s": self.window.quota.window_s,
            "resets_at": self.window.resets_at,
            "retry_after_s": round(self.retry_after_s, 3),
            "message": self.message,
        }


def denial(windows: list[Window], read: dict[str, Any]) -> Denial | None:
    """The first quota whose window is spent (used >= limit), or None."""
    for w in windows:
        tokens, cost = usage(read.get(w.key))
        if w.quota.tokens is not None and tokens >= w.quota.tokens:
            return Denial(w, "tokens", tokens, w.quota.tokens)
        if w.quota.cost is not None and cost >= w.quota.cost:
            return Denial(w, "cost", cost, w.quota.cost)
    return None
