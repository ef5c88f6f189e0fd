"""`bench.streaming_capacity --timeline`'s report: the loop lag and the flush timer's rounds per 200 ms, and the ends."""

from __future__ import annotations

import json
from pathlib import Path

from bench import timeline


def _row(report: str, start: str) -> list[str]:
    return next(line.split() for line in report.splitlines() if line.split()[:1] == [start])


def test_the_report_counts_the_flush_timers_rounds_and_their_steps_per_bucket(tmp_path: Path) -> None:
    t0 = 1000.0
    data = {
        "lags": [[t0, 0.010], [t0 + 0.05, 0.030], [t0 + 0.25, 0.100]],
        "flushes": [[t0 + 0.01, 4], [t0 + 0.1, 2], [t0 + 0.3, 9], [t0 - 5.0, 100]],  # the last: before the round
        "ends": [{"seen": t0 + 0.3, "resumed": t0 + 0.31, "commit": t0 + 0.312, "committed": t0 + 0.33}],
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    report = timeline.report(str(path), (t0 - 1.0, t0 + 1.0))
    assert _row(report, "0.0")[1:] == ["2", "10.0", "30.0", "2", "3.0"]  # 2 deltas; 2 rounds of 4 and 2 steps
    assert _row(report, "0.2")[1:] == ["1", "100.0", "100.0", "1", "9.0"]
    assert "the 1 streamed steps' ends" in report


def test_a_bucket_without_a_timed_flush_shows_none(tmp_path: Path) -> None:
    data = {"lags": [[5.0, 0.002]], "ends": [{"seen": 5.0, "resumed": 5.0, "commit": 5.0, "committed": 5.0}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))  # a file written before the flush rounds were recorded
    assert _row(timeline.report(str(path), (0.0, 10.0)), "0.0")[1:] == ["1", "2.0", "2.0", "0", "-"]


def test_an_unreadable_timeline_is_one_line(tmp_path: Path) -> None:
    assert timeline.report(str(tmp_path / "missing.json"), (0.0, 1.0)).startswith("(no timeline:")
