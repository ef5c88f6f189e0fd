"""A step that raises where nothing expects it, on a real (in-process) Celery worker and real Redis: the
turn ends failed with one clear line in its `error` event and its result (secrets masked, no traceback),
its lease released; it is never left leased and `running` with the exception gone into Celery's log.
A tool whose result cannot be sent (a circular reference) is the tool's error and the turn goes on."""

from __future__ import annotations

from typing import Any

import pytest

from stepq.fleet.runtime import Runtime
from stepq.models import EventType, TurnStatus
from tests.agents_crash import SECRET_VAR

SECRET = "sk-ant-test-crash-Vb93kQ0x"
WAIT = 120  # generous: the machine is shared and busy


def _run(client: Any, agent: str) -> tuple[Any, list[Any]]:
    handle = client.submit(agent, prompt="go")
    result = handle.wait(timeout=WAIT)
    return result, list(handle.events())


def _errors(events: list[Any]) -> list[str]:
    return [e.data["message"] for e in events if e.type == EventType.ERROR]


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ("crash.unprintable_model", "provider error: UnprintableError"),
        ("crash.redis_reply_model", "step 0 crashed: ResponseError: WRONGTYPE Operation against a key holding"),
        ("crash.buggy_hook", "step 0 crashed: KeyError: 'no entry for key ***'"),
    ],
)
def test_a_step_that_raises_fails_its_turn_with_one_clear_line(worker, client, rt: Runtime, monkeypatch, agent, error):
    monkeypatch.setenv(SECRET_VAR, SECRET)
    result, events = _run(client, agent)

    assert result.status == TurnStatus.FAILED
    assert (result.error or "").startswith(error)
    assert _errors(events) == [result.error]
    assert "\n" not in result.error and "Traceback" not in result.error and SECRET not in str(events)
    assert events[-1].type == EventType.TURN_FINISH and events[-1].data["status"] == "failed"
    assert not rt.redis.exists(rt.keys.lease(result.turn_id))


def test_a_tool_result_with_a_circular_reference_is_the_tools_error_on_a_worker(worker, client):
    result, events = _run(client, "th.cycle")

    assert result.status == TurnStatus.COMPLETED and result.text == "done", result.error
    [tool_result] = [e.data for e in events if e.type == EventType.TOOL_RESULT]
    assert tool_result["is_error"] and "circular reference" in tool_result["output"]["error"]
