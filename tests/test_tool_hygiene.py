"""Tool execution hygiene, in-process against real Redis: a tool's exception reaches the model sanitised
(type and a bounded one-line message, secrets masked; the full error only in the log), a timed-out async
tool's task is cancelled and a subprocess tool's process killed, calls still running past their timeout
are bounded per tool (the next one is refused without a thread, and a gauge counts them), and the turn's
cancellation reaches a running tool's `ctx.cancelled` (sync and async)."""

from __future__ import annotations

import logging
import os
import threading

import pytest
import redis
from prometheus_client import REGISTRY

from stepq.engine.runner import StepRunner
from stepq.engine.tool_exec import LINGERING
from stepq.fleet.runtime import get_runtime
from stepq.models import TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive, tool_results
from tests.agents_tool_hygiene import HUGE_CHARS, mark_key
from tests.conftest import REDIS_URL, eventually, make_settings

SECRET = "sk-test-Zq81mXv0Lw7ds9"
side = redis.Redis.from_url(REDIS_URL, decode_responses=True)


def _start(rt, agent: str, prefix: str, **metadata: object) -> str:
    state, created = create_turn(rt, agent, prompt="go", metadata={"prefix": prefix, **metadata})
    assert created
    return state.turn_id


def _marks(prefix: str, turn_id: str, what: str) -> list[str]:
    return side.lrange(mark_key(prefix, turn_id, what), 0, -1)


def test_a_tool_exception_reaches_the_model_sanitised_and_the_log_whole(rt, prefix, caplog, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)  # a known secret: masked wherever it appears
    caplog.set_level(logging.DEBUG, logger="stepq.tools")
    turn_id = _start(rt, "th.leaky", prefix, secret=SECRET)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED
    result = tool_results(state)["c0"]
    error = result.output["error"]
    assert result.is_error and error.startswith("ValueError: upstream refused key ***")
    assert SECRET not in error and "hunter2-xyz" not in error
    assert "\n" not in error and "Traceback" not in error
    assert len(error) <= len("ValueError: ") + rt.settings.tool_error_chars + 1
    events = [e.data for e in rt.events.read(turn_id) if e.type == "tool-result"]
    assert events and SECRET not in str(events) and "hunter2-xyz" not in str(events)
    # WARNING: the error on one line, as the model reads it; DEBUG: the whole error with its traceback (the
    # worker's log handlers mask its secrets; see tests/test_observability.py)
    [warning] = [r for r in caplog.records if "th_leaky" in r.getMessage() and r.levelno == logging.WARNING]
    assert warning.exc_info is None and warning.getMessage().endswith(f"raised {error}")
    [debug] = [r for r in caplog.records if "th_leaky" in r.getMessage() and r.levelno == logging.DEBUG]
    assert debug.exc_info is not None and "detail line" in str(debug.exc_info[1])


def test_a_timed_out_async_tool_has_its_task_cancelled(rt, prefix):
    turn_id = _start(rt, "th.async_slow", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED and state.text == "done"
    assert tool_results(state)["c0"].output["error"] == "tool th_async_slow timed out after 0.2s"
    eventually(lambda: _marks(prefix, turn_id, "async-cancelled"), what="the async tool's task to be cancelled")
    eventually(lambda: LINGERING.count("th_async_slow") == 0, what="its executor thread to be free")


def test_a_timed_out_subprocess_tool_has_its_process_killed(rt, prefix):
    turn_id = _start(rt, "th.process_slow", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED and state.text == "done"
    assert tool_results(state)["c0"].output["error"] == "tool th_process_slow timed out after 0.2s"
    eventually(lambda: _marks(prefix, turn_id, "process-killed"), what="run_process to report the kill")

    def gone() -> bool:  # no process left whose command line names this turn (the script carries its id)
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if turn_id.encode() in f.read():
                        return False
            except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
                continue
        return True

    eventually(gone, what="the subprocess to be gone")
    eventually(lambda: LINGERING.count("th_process_slow") == 0, what="its executor thread to be free")


def _lingering() -> float:
    return REGISTRY.get_sample_value("stepq_tool_calls_lingering", {"tool": "th_ignores_cancel"}) or 0.0


def test_calls_lingering_past_their_timeout_are_bounded_per_tool(prefix):
    rt = get_runtime(make_settings(prefix, tool_max_lingering=1))
    before = _lingering()
    turn_id = _start(rt, "th.lingering", prefix)
    try:
        state = drive(rt, turn_id)
        results = tool_results(state)
        assert results["c0"].output["error"] == "tool th_ignores_cancel timed out after 0.2s"
        # the second call is refused at once: the first still holds its thread
        refused = results["c1"].output["error"]
        assert refused == "tool th_ignores_cancel not run: 1 earlier calls of it are still running past their timeout"
        assert _marks(prefix, turn_id, "lingering-started") == ["1"]  # the refused call never started
        assert _lingering() == before + 1
    finally:
        side.rpush(mark_key(prefix, turn_id, "gate-g"), "open")  # free the thread
    eventually(lambda: _lingering() == before, what="the gauge to drop once the tool returned")
    eventually(lambda: LINGERING.count("th_ignores_cancel") == 0, what="the lingering count to drop")


@pytest.mark.parametrize(
    ("agent", "started", "seen"),
    [
        ("th.watch_cancel", "watch-started", "watch-saw"),
        ("th.async_watch", "async-watch-started", "async-watch-cancelled"),
    ],
)
def test_the_turns_cancellation_reaches_a_running_tool(rt, prefix, agent, started, seen):
    turn_id = _start(rt, agent, prefix)
    decisions: list[object] = []
    runner = threading.Thread(target=lambda: decisions.append(StepRunner(rt).deliver(turn_id, 0)), daemon=True)
    runner.start()
    eventually(lambda: _marks(prefix, turn_id, started), what="the tool to start")
    rt.turns.request_cancel(turn_id)
    eventually(lambda: _marks(prefix, turn_id, seen), what="the tool to see the cancellation")
    runner.join(timeout=60)
    assert not runner.is_alive()
    if agent == "th.watch_cancel":
        assert _marks(prefix, turn_id, seen) == ["True"]
    [decision] = decisions
    assert decision.action == "next"  # the tool step ended normally, its result stored
    StepRunner(rt).deliver(turn_id, decision.step)  # the next delivery finds the cancel flag
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.CANCELLED


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ("th.cycle", "tool th_cycle returned a result that refers to itself (a circular reference)"),
        (
            "th.unprintable",
            "tool th_unprintable returned a result that cannot be sent as JSON: RuntimeError: no text for this object",
        ),
        ("th.raises_unprintable", "UnprintableError"),
    ],
)
def test_a_result_or_error_that_cannot_be_sent_becomes_the_tools_error_and_the_turn_goes_on(rt, prefix, agent, error):
    turn_id = _start(rt, agent, prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED and state.text == "done", state.error
    result = tool_results(state)["c0"]
    assert result.is_error and result.output == {"error": error, "status": "failed"}
    [event] = [e.data for e in rt.events.read(turn_id) if e.type == "tool-result"]
    assert event["is_error"] and event["output"]["error"] == error


def test_a_50_mb_tool_result_is_cut_and_the_turn_goes_on(rt, prefix):
    turn_id = _start(rt, "th.huge", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED and state.text == "done", state.error
    output = tool_results(state)["c0"].output
    limit = rt.settings.max_tool_result_chars
    assert isinstance(output, str) and output.startswith('"xxx') and len(output) < limit + 100
    assert output.endswith(f"…[truncated {HUGE_CHARS + 2 - limit} chars]")
