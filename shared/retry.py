"""When to retry a step and how long to wait: only before its first streamed chunk, with jittered backoff.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import random


def backoff_countdown(attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**attempt))."""
    ceiling = min(cap_s, base_s * (2 ** max(attempt, 0)))
    return (rng or random).uniform(0, ceiling)


def retry_countdown(retry_after_s: float | None, attempt: int, base_s: float, cap_s: float) -> float:
    """The provider's Retry-After when it gave one, else jittered backoff."""
    if retry_after_s is not None:
        return max(0.0, retry_after_s)
    return backoff_countdown(attempt, base_s, cap_s)
