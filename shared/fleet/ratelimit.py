"""Shared per-provider/model rate limits, enforced across every worker by one atomic Lua script.

Three limits: requests per minute (a sliding-window log, exact), tokens per minute
(a sliding window of token charges with a running sum) and concurrent steps (a set
of holders that expire, so a crashed worker's slot comes back). A step that gets no
capacity learns how long to wait and re-queues itself with that countdown.

Requests and tokens count against the window for `window_s + margin_s`: the provider
counts them when they arrive, and each one arrives a little after its grant (scheduling,
the network), by a delay that varies. Spacing grants by the window plus a margin at least
that variation means the provider never sees more than `rpm` requests in its own window.

Every timestamp is Redis's clock (TIME inside the scripts), so workers on hosts whose
clocks disagree still share one exact window.

A 429 from the provider tightens the limit for the whole fleet: the configured
limits are scaled by a penalty factor for a cool-down period, and, when the
provider said how long to wait, every step of that provider/model waits that long.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import redis

from stepq.models import RATE_MARGIN_S, RATE_WINDOW_S
from stepq.models import RateLimit as RateLimit  # the data lives below agents and settings; enforced here
from stepq.store.keys import Keys

WINDOW_S = RATE_WINDOW_S
MARGIN_S = RATE_MARGIN_S

# Redis's own clock, in seconds, as the scripts' `now`
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# KEYS: requests zset, tokens zset, tokens sum, holders zset, penalty, paused-until
# ARGV: rpm, tpm, concurrency, est tokens, holder id, hold ttl, counting window (window + margin)
# Returns {allowed, wait, reason, now}; `now` (the grant's time when allowed) is exact: %.17g round-trips.
_ACQUIRE = (
    _NOW
    + """
local window = tonumber(ARGV[7])
local at = string.format('%.17g', now)
local paused = tonumber(redis.call('GET', KEYS[6]) or '0')
if paused > now then return {0, tostring(paused - now), 'paused', at} end
local factor = tonumber(redis.call('GET', KEYS[5]) or '1')
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local conc = tonumber(ARGV[3])
local est = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - window)
if #old > 0 then
  local freed = 0
  for _, member in ipairs(old) do freed = freed + tonumber(string.match(member, '^(%d+):')) end
  redis.call('DECRBY', KEYS[3], freed)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
end
if conc > 0 then
  local limit = math.max(1, math.floor(conc * factor))
  if redis.call('ZCARD', KEYS[4]) >= limit then
    local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return {0, tostring(math.max(0.05, math.min(tonumber(first[2]) - now, 1.0))), 'concurrency', at}
  end
end
if rpm > 0 then
  local limit = math.max(1, math.floor(rpm * factor))
  if redis.call('ZCARD', KEYS[1]) >= limit then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, tostring(math.max(0.01, tonumber(first[2]) + window - now)), 'rpm', at}
  end
end
if tpm > 0 then
  local limit = math.max(1, math.floor(tpm * factor))
  local used = tonumber(redis.call('GET', KEYS[3]) or '0')
  if used > 0 and used + est > limit then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {0, tostring(math.max(0.01, tonumber(first[2]) + window - now)), 'tpm', at}
  end
end
if rpm > 0 then redis.call('ZADD', KEYS[1], now, ARGV[5]) end
if tpm > 0 and est > 0 then
  redis.call('ZADD', KEYS[2], now, est .. ':' .. ARGV[5])
  redis.call('INCRBY', KEYS[3], est)
end
if conc > 0 then redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), ARGV[5]) end
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], math.ceil((window + tonumber(ARGV[6])) * 1000)) end
return {1, '0', 'ok', at}
"""
)

# KEYS: tokens zset, tokens sum, holders zset. ARGV: holder id, est tokens, actual tokens
_RELEASE = (
    _NOW
    + """
redis.call('ZREM', KEYS[3], ARGV[1])
local est = tonumber(ARGV[2])
local actual = tonumber(ARGV[3])
if actual >= 0 and est >= 0 then
  if redis.call('ZREM', KEYS[1], est .. ':' .. ARGV[1]) == 1 then
    redis.call('DECRBY', KEYS[2], est)
  end
  if actual > 0 then
    redis.call('ZADD', KEYS[1], now, actual .. ':' .. ARGV[1])
    redis.call('INCRBY', KEYS[2], actual)
  end
end
return 1
"""
)


@dataclass(frozen=True)
class Grant:
    allowed: bool
    wait_s: float
    reason: str
    holder: str
    estimate: int
    at: float  # Redis's clock when the limiter decided (for a grant: the time it counts from)


class RateLimiter:
    def __init__(self, client: redis.Redis, keys: Keys, hold_ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.hold_ttl_s = hold_ttl_s
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    def acquire(self, scope: str, limit: RateLimit, estimate_tokens: int) -> Grant:
        holder = uuid.uuid4().hex
        allowed, wait, reason, at = self._acquire(
            keys=list(self.keys.rate_limit(scope)),
            args=[
                limit.rpm or 0,
                limit.tpm or 0,
                limit.concurrency or 0,
                max(0, estimate_tokens),
                holder,
                self.hold_ttl_s,
                repr(limit.counting_window_s),
            ],
        )
        reason = reason.decode() if isinstance(reason, bytes) else str(reason)  # "rpm", not "b'rpm'"
        return Grant(bool(int(allowed)), float(wait), reason, holder, max(0, estimate_tokens), float(at))

    def release(self, scope: str, grant: Grant, actual_tokens: int | None) -> None:
        """Free the concurrency slot and replace the token estimate with what the step really used."""
        keys = self.keys.rate_limit(scope)
        self._release(
            keys=[keys.tokens, keys.token_sum, keys.holders],
            args=[grant.holder, grant.estimate, -1 if actual_tokens is None else actual_tokens],
        )

    def penalize(self, scope: str, limit: RateLimit, retry_after_s: float | None) -> None:
        """A 429: scale the fleet's limit down for a while, and pause it for the provider's retry-after."""
        keys = self.keys.rate_limit(scope)
        pipe = self.client.pipeline()
        current = self.client.get(keys.penalty)
        factor = max(0.05, (float(current) if current else 1.0) * limit.penalty_factor)
        if limit.penalty_s > 0:
            pipe.set(keys.penalty, f"{factor:.4f}", ex=max(1, int(limit.penalty_s)))
        if retry_after_s:
            seconds, micros = self.client.time()  # the clock the acquire script compares with
            until = seconds + micros / 1_000_000 + retry_after_s
            pipe.set(keys.paused_until, f"{until:.6f}", px=max(1, int(retry_after_s * 1000)))
        pipe.execute()

    def penalty(self, scope: str) -> float:
        value = self.client.get(self.keys.rate_limit(scope).penalty)
        return float(value) if value else 1.0


def estimate_tokens(chars: int, max_output: int | None) -> int:
    """A cheap pre-call estimate (≈4 characters a token); corrected with real usage after the step."""
    return chars // 4 + (max_output or 512)
