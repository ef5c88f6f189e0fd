"""The per-step cost of compaction's check: a long turn with a known context window (each step checks
its request against the limit; never over it, so nothing is compacted) against the same turn with
compaction off (`STEPQ_COMPACT_AT=0`), side by side, in-process (StepRunner on real Redis, no broker:
the engine's own cost, not Celery's). The model is the scripted one taken to report real usage
(`bench.overhead_measured`), so the check takes the path a real provider's turn takes: the last call's
reported usage plus what was added since, with no pass over the whole transcript.

    .venv/bin/python -m bench.compaction_check [--steps 300] [--rounds 3]

Prints ms/step for each side and the ratio; exits 1 when the check costs more than 10% per step.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench._common import DEFAULT_REDIS_URL, bench_settings, cleanup, median, positive_count, table, unique_prefix
from stepq.engine.runner import StepRunner
from stepq.fleet.runtime import get_runtime
from stepq.turns.submit import create_turn

TARGET_RATIO = 1.10


def run_turn(redis_url: str, steps: int, check: bool) -> float:
    """ms/step of one turn of `steps` steps (a tool call each: the transcript grows by two messages a step)."""
    prefix = unique_prefix("compact")
    overrides = {"context_windows": {"bench-model": 10**9}} if check else {"compact_at": 0.0}
    rt = get_runtime(bench_settings(redis_url, prefix, **overrides))
    try:
        state, _ = create_turn(rt, "bench.overhead_measured", prompt="go", loop={"max_steps": steps})
        runner_step, started = 0, time.perf_counter()
        for _ in range(steps + 1):
            decision = StepRunner(rt).deliver(state.turn_id, runner_step)
            if decision.action == "none":
                break
            runner_step = decision.step
        elapsed = time.perf_counter() - started
        final = rt.turns.load(state.turn_id)
        assert final is not None and final.status.value == "completed", final
        assert final.compaction is None
        return elapsed * 1000 / steps
    finally:
        cleanup(redis_url, prefix)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=positive_count, default=300)
    parser.add_argument("--rounds", type=positive_count, default=3)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    for _ in range(args.rounds):  # interleaved, so both sides see the same machine load
        off.append(run_turn(args.redis_url, args.steps, check=False))
        on.append(run_turn(args.redis_url, args.steps, check=True))
    ratio = median(on) / median(off)
    rows = [
        ["compaction off", f"{median(off):.2f}", " ".join(f"{v:.2f}" for v in off)],
        ["check each step", f"{median(on):.2f}", " ".join(f"{v:.2f}" for v in on)],
    ]
    print(table(["side", "median ms/step", "runs"], rows))
    print(
        f"{args.steps} steps (transcript up to {2 * args.steps + 1} messages): check/off = {ratio:.3f}x "
        f"(target <= {TARGET_RATIO}x)"
    )
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
