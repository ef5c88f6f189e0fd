"""When to retry a step, how long to wait (only before its first streamed chunk, with jittered backoff),
and where a step whose attempts are spent goes next (its fallbacks).

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from stepq.models import Fallback


def backoff_countdown(attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**attempt))."""
    ceiling = min(cap_s, base_s * (2 ** max(attempt, 0)))
    return (rng or random).uniform(0, ceiling)


def retry_countdown(retry_after_s: float | None, attempt: int, base_s: float, cap_s: float) -> float:
    """The provider's Retry-After when it gave one, else jittered backoff."""
    if retry_after_s is not None:
        return max(0.0, retry_after_s)
    return backoff_countdown(attempt, base_s, cap_s)


def next_fallback(fallbacks: Sequence[Fallback], provider: str, model: str) -> Fallback | None:
    """The fallback after the current provider/model: the first one when the step is still on its primary,
    None when the list is spent. The position in the list is the state, so nothing else is stored."""
    position = next((i for i, f in enumerate(fallbacks) if (f.provider, f.model) == (provider, model)), -1)
    return fallbacks[position + 1] if position + 1 < len(fallbacks) else None
