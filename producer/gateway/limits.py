"""Per-credential request rate limit, on the same Redis limiter (one atomic script) workers use for
provider quotas, so every gateway replica shares one budget per credential."""

from __future__ import annotations

import math

from stepq.fleet.ratelimit import RateLimit
from stepq.producer.gateway.auth import Principal
from stepq.producer.gateway.errors import GatewayError
from stepq.producer.gateway.service import Gateway


class RequestLimiter:
    def __init__(self, gw: Gateway, rpm: int) -> None:
        self.gw = gw
        self.limit = RateLimit(rpm=rpm, margin_s=0)  # the gateway counts its own arrivals: no delay to cover

    async def check(self, principal: Principal) -> None:
        """429 with Retry-After when this credential used up its requests per minute."""
        scope = f"gateway/{principal.tenant}/{principal.subject}"
        grant = await self.gw.run_sync(self.gw.runtime.limiter.acquire, scope, self.limit, 0)
        if not grant.allowed:
            retry = max(1, math.ceil(grant.wait_s))
            raise GatewayError(
                429,
                "rate-limited",
                f"over {self.limit.rpm} requests a minute for this credential (STEPQ_GATEWAY_RATE_LIMIT_RPM); "
                f"retry in {retry}s",
                {"Retry-After": str(retry)},
            )
