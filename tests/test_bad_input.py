"""Bad input gets a clear error and corrupts nothing: a negative events cursor, a prompt that is not UTF-8,
loop overrides given as a string, NaN in metadata or in a tool's result, a tool that outlives its timeout."""

from __future__ import annotations

import json
import logging
import math

import pytest

from stepq.engine.runner import StepRunner
from stepq.errors import EventCursorError, OverrideError, SubmitError, WaitTimeoutError
from stepq.models import EventType, ToolResultMessage, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_recovery import execution_key
from tests.conftest import REDIS_URL, eventually, make_settings
from tests.test_cli import stepq


def _strict_json(text: str) -> object:
    """Parse as any strict JSON reader would: NaN and Infinity are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _run_to_end(rt, turn_id: str) -> None:
    while StepRunner(rt).deliver(turn_id, rt.turns.load(turn_id).step).action == "next":
        pass


def _nothing_stored(rt) -> bool:
    return not rt.turns.indexes.count("active") and not list(rt.redis.scan_iter(match=f"{rt.keys.prefix}:turn:*"))


def test_negative_events_cursor_is_a_clear_error(rt, prefix, settings, client):
    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
    with pytest.raises(EventCursorError, match="must not be negative"):
        list(client.events(state.turn_id, after=-5))
    from tests.conftest import settings_env

    done = stepq(settings_env(settings), "events", state.turn_id, "--after", "-5")
    assert done.returncode != 0
    assert "must not be negative" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("bad", [math.nan, -1, "5"])
def test_a_wait_limit_that_is_not_a_number_of_seconds_is_refused_at_the_call(prefix, bad):
    """A NaN limit was never reached: `wait` hung for the Redis outage window and then blamed Redis. A negative
    one reported a timeout 'after -1s'. Both are now a ValueError at the call, as the standard library's
    queues raise for such a timeout."""
    from stepq.producer.client import ApprovalReceipt, Client

    client = Client(make_settings(prefix, redis_outage_s=1))
    state, _ = create_turn(client.runtime, "rt.basic", prompt="go", metadata={"prefix": prefix})
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0"):
        client.wait(state.turn_id, timeout=bad)
    with pytest.raises(ValueError, match="idle_timeout must be None or a number of seconds >= 0"):
        client.events(state.turn_id, idle_timeout=bad)
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0"):
        ApprovalReceipt(client, "apr_0123456789abcdef", "req-1").wait(timeout=bad)
    with pytest.raises(WaitTimeoutError):  # zero is a valid limit: look once
        client.wait(state.turn_id, timeout=0)


def test_prompt_that_is_not_utf8_is_refused_as_such(rt, prefix):
    undecodable = b"caf\xe9 au lait".decode("utf-8", errors="surrogateescape")  # Latin-1 bytes read as UTF-8
    with pytest.raises(SubmitError, match=r"prompt is not valid UTF-8 text .*character 3"):
        create_turn(rt, "rt.basic", prompt=undecodable, metadata={"prefix": prefix})
    with pytest.raises(SubmitError, match=r"messages\[0\] is not valid UTF-8 text"):
        create_turn(rt, "rt.basic", messages=[{"role": "user", "content": undecodable}], metadata={"prefix": prefix})
    assert _nothing_stored(rt)


def test_a_bad_loop_override_names_its_field_by_its_path(rt, prefix):
    """One line a person reads, as every other validation refusal: what is wrong at the field's dotted path (not
    pydantic's tuple, `at ('max_steps',)`, and not a union member's class name)."""
    for loop, said in [
        ({"max_steps": 0}, "invalid loop overrides: Input should be greater than or equal to 1 at max_steps"),
        (
            {"budget": {"max_tool_calls": -1}},
            "invalid loop overrides: Input should be greater than or equal to 0 at budget.max_tool_calls",
        ),
        ({"max_stepz": 1}, "invalid loop overrides: Extra inputs are not permitted at max_stepz"),
    ]:
        with pytest.raises(OverrideError) as info:
            create_turn(rt, "rt.basic", prompt="go", loop=loop, metadata={"prefix": prefix})
        assert str(info.value).startswith(said), str(info.value)
    assert _nothing_stored(rt)


def test_loop_overrides_given_as_a_string_are_refused(rt, prefix):
    with pytest.raises(OverrideError, match=r"loop must be a mapping.*not str.*json\.loads"):
        create_turn(rt, "rt.basic", prompt="go", loop='{"max_steps": 1}', metadata={"prefix": prefix})  # type: ignore[arg-type]
    with pytest.raises(OverrideError, match="not list"):
        create_turn(rt, "rt.basic", prompt="go", loop=[1], metadata={"prefix": prefix})  # type: ignore[arg-type]
    assert _nothing_stored(rt)


@pytest.mark.parametrize(
    ("metadata", "where"),
    [({"x": math.nan}, "metadata.x"), ({"a": {"b": [1, math.inf]}}, r"metadata.a.b\[1\]")],
)
def test_metadata_with_nan_is_refused(rt, metadata, where):
    with pytest.raises(SubmitError, match=f"{where} is NaN or Infinity"):
        create_turn(rt, "rt.basic", prompt="go", metadata=metadata)
    assert _nothing_stored(rt)


def test_metadata_or_context_a_json_parser_could_not_read_is_refused_by_submit_and_threads(rt):
    """A key that is not a string raised pydantic's raw ValidationError from submit; a NaN in a context (of an
    agent with no context_schema) or in a thread's metadata was stored as `NaN`, which other parsers refuse."""
    from stepq.errors import ContextError
    from stepq.turns.threads import create_thread

    with pytest.raises(SubmitError, match=r"^metadata.a has a key that is not a string \(1\)"):
        create_turn(rt, "rt.basic", prompt="go", metadata={"a": {1: "x"}})
    with pytest.raises(ContextError, match=r"^context.x\[0\] is NaN or Infinity"):
        create_turn(rt, "rt.basic", prompt="go", context={"x": [math.nan]})
    assert _nothing_stored(rt)
    with pytest.raises(SubmitError, match=r"^metadata.score is NaN or Infinity"):
        create_thread(rt, "rt.basic", metadata={"score": math.inf})
    assert not list(rt.redis.scan_iter(match=f"{rt.keys.prefix}:thread*"))


def test_tool_returning_nan_gives_valid_json_everywhere(rt, prefix):
    state, _ = create_turn(rt, "rc.not_finite_result", prompt="go", metadata={"prefix": prefix})
    _run_to_end(rt, state.turn_id)
    final = rt.turns.load(state.turn_id)
    assert final.status == TurnStatus.COMPLETED
    expected = {"nan": "NaN", "list": [1.5, "Infinity", "-Infinity"]}
    # the raw event log: every entry parses as strict JSON, and the tool result carries the mapped values
    raw = [fields["e"] for _, fields in rt.redis.xrange(rt.keys.events(state.turn_id))]
    events = [_strict_json(entry) for entry in raw]
    [result] = [e for e in events if e["type"] == EventType.TOOL_RESULT]
    assert result["data"]["output"] == expected
    # the stored result and the transcript the model reads next step hold the same
    stored = rt.redis.hget(rt.keys.tool_results(state.turn_id), result["data"]["id"])
    assert _strict_json(stored)["output"] == expected
    [message] = [m for m in final.messages if isinstance(m, ToolResultMessage)]
    assert message.results[0].output == expected


def test_timed_out_tool_is_told_to_stop_and_its_late_result_is_discarded(rt, prefix, caplog):
    import redis

    caplog.set_level(logging.WARNING, logger="stepq.tools")
    state, _ = create_turn(rt, "rc.timing_out", prompt="go", metadata={"prefix": prefix})
    _run_to_end(rt, state.turn_id)
    final = rt.turns.load(state.turn_id)
    assert final.status == TurnStatus.COMPLETED
    [message] = [m for m in final.messages if isinstance(m, ToolResultMessage)]
    for result in message.results:  # the model read the timeouts
        assert result.is_error and "timed out" in result.output["error"]
    side = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    # the careful tool saw the flag and stopped without its effect
    eventually(lambda: side.get(execution_key(prefix, state.turn_id, "careful", "stopped")), what="the tool to stop")
    assert side.get(execution_key(prefix, state.turn_id, "careful", "effect")) is None
    # the one that ignored it answered late: logged and discarded, the stored result is still the timeout
    eventually(lambda: "rc_slow_answer" in caplog.text and "discarded" in caplog.text, what="the late-result log")
    stored = rt.tool_results.get_many(state.turn_id, [r.tool_call_id for r in message.results])
    assert all(r.is_error and "timed out" in r.output["error"] for r in stored.values())
    assert "late" not in json.dumps([e.data for e in rt.events.read(state.turn_id)])
