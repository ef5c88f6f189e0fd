"""A benchmark's output PATH flag whose folder is missing stops it at once with one line (the worker would only
write there at its shutdown, after the whole run), before anything touches Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import chat_under_batch, step_overhead, streaming_capacity
from tests.conftest import ROOT


@pytest.mark.parametrize("flag", ["--timeline", "--profile", "--profile-end"])
def test_streaming_capacity_refuses_an_output_path_in_a_missing_folder(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "out"
    with pytest.raises(SystemExit) as exit_:
        streaming_capacity.main([flag, str(missing), "--redis-url", "redis://127.0.0.1:1/0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"error: {flag} {missing}: no folder {missing.parent} to write to")


def test_step_overhead_refuses_a_profile_path_in_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "stats"
    with pytest.raises(SystemExit) as exit_:
        step_overhead.main(["--profile", str(missing), "--redis-url", "redis://127.0.0.1:1/0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"--profile {missing}: no folder {missing.parent} to write to")


def test_chat_under_batch_refuses_a_backlog_too_small_to_measure(capsys: pytest.CaptureFixture[str]) -> None:
    """With fewer queued items than the run must still find at its end, it would only fail after minutes."""
    with pytest.raises(SystemExit) as exit_:
        chat_under_batch.main(["--batch-items", "500", "--redis-url", "redis://127.0.0.1:1/0"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"error: --batch-items must be more than {chat_under_batch.MIN_BACKLOG}: the chats must still find a "
            "backlog at their end"
        )
    )


@pytest.mark.parametrize(
    ("module", "flag"),
    [
        ("step_overhead", "--turns"),
        ("streaming_capacity", "--levels"),
        ("fanout", "--repeat"),
        ("batch_throughput", "--items"),
        ("provider_ttfc", "--turns"),
        ("recovery", "--turns"),
        ("compaction_check", "--steps"),
        ("chat_under_batch", "--chats"),
        ("provider_batch", "--items"),
        ("gateway_streams", "--streams"),
        ("stream_parsing", "--deltas"),
    ],
)
def test_a_count_of_zero_is_refused_before_anything_runs(module: str, flag: str) -> None:
    """A zero ran nothing and then divided by it (`--turns 0`: ZeroDivisionError after starting the workers)."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", flag, "0", "--redis-url", "redis://127.0.0.1:1/0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"error: argument {flag}: '0': must be 1 or more")
