"""bench.provider_ttfc's verdict: met only when stepq's p50 is within both bounds of the direct call's."""

from __future__ import annotations

import pytest

from bench.provider_ttfc import verdict


@pytest.mark.parametrize(
    ("direct_s", "stepq_s", "met"),
    [
        (0.0500, 0.0514, True),  # +1.4 ms, 1.028x
        (0.0500, 0.0516, False),  # +1.6 ms: over the 1.5 ms bound although 1.032x is close
        (0.0200, 0.0210, False),  # +1.0 ms but 1.05x: over the ratio bound
        (0.1000, 0.1030, False),  # 1.03x but +3 ms
        (0.0500, 0.0490, True),  # faster than the direct call
    ],
)
def test_verdict_needs_both_the_ratio_and_the_added_milliseconds(direct_s: float, stepq_s: float, met: bool) -> None:
    ok, line = verdict(direct_s, stepq_s)
    assert ok is met
    assert line.endswith("met.") and (" not met." in line) is not met
