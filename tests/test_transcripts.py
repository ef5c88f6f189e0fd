"""Safe transcripts: submit refuses unpaired tool calls and results, naming them; TurnResult.messages is the
paired, canonical transcript that submit takes back."""

from __future__ import annotations

import pytest

from stepq.errors import TranscriptError
from stepq.models import AssistantMessage, ToolResultMessage, TurnStatus
from stepq.turns.submit import create_turn
from tests.test_client_tools import _parked
from tests.test_submit import stored_keys

WAIT = 120


def call(call_id: str, name: str = "rt_echo") -> dict:
    return {"type": "tool-call", "id": call_id, "name": name, "args": {"text": "x"}}


def result(call_id: str, name: str = "rt_echo") -> dict:
    return {"tool_call_id": call_id, "name": name, "output": {"echo": "x"}}


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "named"),
    [
        ([USER, {"role": "assistant", "parts": [call("c1")]}], ["messages[1]: tool call 'c1' (rt_echo) has no result"]),
        (
            [
                USER,
                {"role": "assistant", "parts": [call("c1"), call("c2")]},
                {"role": "tool", "results": [result("c1")]},
            ],
            ["messages[1]: tool call 'c2' (rt_echo) has no result"],
        ),
        (
            [USER, {"role": "assistant", "parts": [call("c1")]}, USER, {"role": "tool", "results": [result("c1")]}],
            [
                "messages[1]: tool call 'c1' (rt_echo) has no result",
                "messages[3].results[0]: result for 'c1' pairs with no tool call",
            ],
        ),
        ([USER, {"role": "tool", "results": [result("zz")]}], ["messages[1].results[0]: result for 'zz' pairs"]),
        (
            [
                USER,
                {"role": "assistant", "parts": [call("c1")]},
                {"role": "tool", "results": [result("c1")]},
                {"role": "tool", "results": [result("c1")]},
            ],
            ["messages[3].results[0]: a second result for tool call 'c1'"],
        ),
    ],
)
def test_unpaired_calls_and_results_are_refused_naming_them(rt, prefix, messages, named):
    with pytest.raises(TranscriptError) as err:
        create_turn(rt, "eng.simple", messages=messages, metadata={"prefix": prefix})
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in named), message
    assert len(err.value.entries) == len(named)
    assert stored_keys(prefix) == []  # nothing stored


def test_a_paired_cycle_split_over_tool_messages_is_accepted(rt, prefix):
    messages = [
        USER,
        {"role": "assistant", "parts": [{"type": "reasoning", "text": "hm", "signature": "s"}, call("c1"), call("c2")]},
        {"role": "tool", "results": [result("c1")]},
        {"role": "tool", "results": [result("c2")]},
        {"role": "assistant", "parts": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": "next"},
    ]
    state, created = create_turn(rt, "eng.simple", messages=messages, metadata={"prefix": prefix})
    assert created and len(state.messages) == 6


def test_turn_result_messages_submit_back_as_the_next_turn(worker, client, prefix):
    """A turn with a tool cycle and reasoning: its result's messages are the next turn's input, unchanged."""
    handle, _ = _parked(client, "ct.browser", prefix)
    client.resume(handle.turn_id, {"call_0_1": "d", "call_0_2": "g"})
    done = handle.wait(timeout=WAIT)
    assert done.status == TurnStatus.COMPLETED
    wire = [m.model_dump(mode="json") for m in done.messages]
    second = client.submit("rt.approver", messages=[*wire, {"role": "user", "content": "again"}])
    state = second.get()
    assert [m.model_dump(mode="json") for m in state.messages[: len(wire)]] == wire
    assert isinstance(state.messages[1], AssistantMessage) and isinstance(state.messages[2], ToolResultMessage)


def test_an_object_mode_answer_submits_back(worker, client, prefix):
    done = client.submit("demo.extractor", prompt="Ada Lovelace, ada@engines.example").wait(timeout=WAIT)
    assert done.status == TurnStatus.COMPLETED, done.error
    again = [*(m.model_dump(mode="json") for m in done.messages), {"role": "user", "content": "again"}]
    assert client.submit("demo.extractor", messages=again).wait(timeout=WAIT).status == TurnStatus.COMPLETED
