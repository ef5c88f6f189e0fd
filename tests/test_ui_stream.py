"""The event -> UI message chunk translation on its own (the real client checks it end to end in
tests/node; these pin the rules that a client cannot see directly)."""

from __future__ import annotations

import json
from typing import Any

from stepq.models import Event, EventType
from stepq.producer.gateway.ui_stream import UIMessageTranslator


def run(*events: tuple[EventType, int, dict[str, Any]]) -> tuple[UIMessageTranslator, list[dict[str, Any]]]:
    translator = UIMessageTranslator("turn_x", {"chatId": "c"})
    chunks: list[dict[str, Any]] = []
    for seq, (kind, step, data) in enumerate(events, start=1):
        chunks += translator.feed(Event(turn_id="turn_x", seq=seq, type=kind, step=step, data=data, ts=0.0))
    return translator, chunks


def types(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


def test_a_reset_step_drops_the_attempt_and_keeps_one_step_open() -> None:
    _, chunks = run(
        (EventType.TURN_START, 0, {}),
        (EventType.STEP_START, 0, {"attempt": 0}),
        (EventType.TEXT_DELTA, 0, {"text": "Hel"}),
        (EventType.STEP_RESET, 0, {"reason": "retrying after partial output"}),
        (EventType.STEP_RETRY, 0, {"attempt": 1, "countdown": 0.1, "error": "overloaded"}),
        (EventType.STEP_START, 0, {"attempt": 1}),
        (EventType.TEXT_DELTA, 0, {"text": "Hello"}),
        (EventType.STEP_FINISH, 0, {}),
        (EventType.TURN_FINISH, 0, {"status": "completed", "finish_reason": "stop", "usage": {}}),
    )
    assert types(chunks) == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "reset-step",
        "data-step-reset",
        "data-retry",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    starts = [c["id"] for c in chunks if c["type"] == "text-start"]
    assert len(set(starts)) == 2, "the retried attempt streams into a fresh part"
    assert all(c.get("transient") for c in chunks if c["type"].startswith("data-"))


def test_approval_chunks_never_carry_the_token_and_a_parked_step_is_seen() -> None:
    translator, chunks = run(
        (EventType.STEP_START, 0, {}),
        (EventType.STEP_FINISH, 0, {}),
        (EventType.TOOL_CALL, 0, {"id": "c1", "name": "lookup", "args": {"k": 1}}),
        (EventType.TOOL_CALL, 0, {"id": "c2", "name": "refund", "args": {"amount": 5}}),
        (EventType.TOOL_RESULT, 0, {"id": "c1", "output": {"v": 2}, "is_error": False, "status": "ok"}),
    )
    assert not translator.parked
    more = translator.feed(
        Event(
            turn_id="turn_x",
            seq=9,
            type=EventType.APPROVAL_REQUEST,
            step=0,
            data={"approval_id": "apv_1", "tool_call_id": "c2", "tool": "refund", "token": "kid.SECRETMAC"},
            ts=0.0,
        )
    )
    assert more == [{"type": "tool-approval-request", "approvalId": "apv_1", "toolCallId": "c2"}]
    assert "SECRETMAC" not in json.dumps(chunks + more)
    assert translator.parked
    closing = translator.end_parked()
    assert closing[-1]["finishReason"] == "tool-calls"
    assert closing[-1]["messageMetadata"]["status"] == "awaiting_approval"


def test_tool_outcomes_and_finish_reasons_map_to_the_protocols() -> None:
    _, chunks = run(
        (EventType.STEP_START, 1, {}),
        (EventType.TOOL_CALL, 1, {"id": "a", "name": "t", "args": {}}),
        (EventType.TOOL_CALL, 1, {"id": "b", "name": "t", "args": {}}),
        (EventType.TOOL_CALL, 1, {"id": "c", "name": "t", "args": {}}),
        (
            EventType.APPROVAL_DECISION,
            1,
            {"approval_id": "apv", "tool_call_id": "b", "decision": "denied", "reason": "no"},
        ),
        (EventType.TOOL_RESULT, 1, {"id": "a", "output": {"error": "boom"}, "is_error": True, "status": "failed"}),
        (EventType.TOOL_RESULT, 1, {"id": "b", "output": {"error": "denied"}, "is_error": True, "status": "denied"}),
        (EventType.TOOL_RESULT, 1, {"id": "c", "output": 3, "is_error": False, "status": "ok"}),
        (
            EventType.TURN_FINISH,
            1,
            {"status": "completed", "finish_reason": "max-steps", "usage": {"output_tokens": 4}},
        ),
    )
    outcomes = [c for c in chunks if c["type"].startswith("tool-output") or c["type"] == "tool-approval-response"]
    assert outcomes == [
        {"type": "tool-approval-response", "approvalId": "apv", "approved": False, "reason": "no"},
        {"type": "tool-output-error", "toolCallId": "a", "errorText": "boom"},
        {"type": "tool-output-denied", "toolCallId": "b"},
        {"type": "tool-output-available", "toolCallId": "c", "output": 3},
    ]
    finish = chunks[-1]
    assert finish["finishReason"] == "other"
    assert finish["messageMetadata"]["finishReason"] == "max-steps"
    assert finish["messageMetadata"]["usage"] == {"output_tokens": 4}
    assert chunks[0] == {"type": "start", "messageId": "turn_x", "messageMetadata": {"turnId": "turn_x", "chatId": "c"}}


def nesting_errors(chunks: list[dict[str, Any]]) -> list[str]:
    """What breaks the step nesting a strict client checks: every step is `start-step … finish-step`, and a
    step's content and its reset come between the two."""
    errors, open_step = [], False
    for i, kind in enumerate(types(chunks)):
        if kind == "start-step":
            errors += [f"{i}: start-step inside an open step"] if open_step else []
            open_step = True
        elif kind == "finish-step":
            errors += [] if open_step else [f"{i}: finish-step without start-step"]
            open_step = False
        elif kind == "reset-step" or kind.startswith(("text-", "reasoning-", "tool-input")):
            errors += [] if open_step else [f"{i}: {kind} outside a step"]
    return errors + (["the message finished inside an open step"] if open_step else [])


def test_an_object_repair_resets_its_step_inside_one_well_nested_step() -> None:
    # the engine's order for a repair: the invalid answer's step finishes, then its reset, then the repair step
    _, chunks = run(
        (EventType.TURN_START, 0, {}),
        (EventType.STEP_START, 0, {"attempt": 0}),
        (EventType.OBJECT_DELTA, 0, {"text": '{"name": "Ada"}'}),
        (EventType.STEP_FINISH, 0, {}),
        (EventType.STEP_RESET, 0, {"reason": "repairing an answer that did not match the schema"}),
        (EventType.STEP_START, 1, {"attempt": 0}),
        (EventType.OBJECT_DELTA, 1, {"text": '{"name": "Ada", "email": "ada@x.example"}'}),
        (EventType.STEP_FINISH, 1, {}),
        (EventType.TURN_FINISH, 1, {"status": "completed", "finish_reason": "stop", "usage": {}}),
    )
    assert nesting_errors(chunks) == [], types(chunks)
    assert types(chunks) == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "reset-step",
        "data-step-reset",
        "finish-step",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]


def test_a_parked_step_and_a_tool_step_close_well_nested() -> None:
    translator, chunks = run(
        (EventType.STEP_START, 0, {}),
        (EventType.TEXT_DELTA, 0, {"text": "I will record it."}),
        (EventType.STEP_FINISH, 0, {}),
        (EventType.TOOL_CALL, 0, {"id": "c1", "name": "record", "args": {}}),
        (EventType.APPROVAL_REQUEST, 0, {"approval_id": "apv_1", "tool_call_id": "c1"}),
    )
    closed = chunks + translator.end_parked()
    assert nesting_errors(closed) == [], types(closed)
    assert types(closed)[-2:] == ["finish-step", "finish"]


def test_streamed_tool_input_opens_the_part_once_and_the_call_completes_it() -> None:
    _, chunks = run(
        (EventType.STEP_START, 0, {}),
        (EventType.TEXT_DELTA, 0, {"text": "Looking"}),
        (EventType.TOOL_INPUT_DELTA, 0, {"id": "c1", "name": "lookup", "text": '{"que'}),
        (EventType.TOOL_INPUT_DELTA, 0, {"id": "c1", "name": "lookup", "text": 'ry": "x"}'}),
        (EventType.TOOL_INPUT_DELTA, 0, {"id": "c2", "name": "other", "text": "{}"}),
        (EventType.STEP_FINISH, 0, {}),
        (EventType.TOOL_CALL, 0, {"id": "c1", "name": "lookup", "args": {"query": "x"}}),
        (EventType.TOOL_CALL, 0, {"id": "c2", "name": "other", "args": {}}),
        (EventType.TOOL_CALL, 0, {"id": "c3", "name": "whole", "args": {"a": 1}}),  # its input did not stream
    )
    assert types(chunks) == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",  # the text part closes before the tool part opens
        "tool-input-start",
        "tool-input-delta",
        "tool-input-delta",
        "tool-input-start",
        "tool-input-delta",
        "tool-input-available",
        "tool-input-available",
        "tool-input-start",
        "tool-input-available",
    ]
    starts = [(c["toolCallId"], c["toolName"]) for c in chunks if c["type"] == "tool-input-start"]
    assert starts == [("c1", "lookup"), ("c2", "other"), ("c3", "whole")]
    pieces = [c["inputTextDelta"] for c in chunks if c["type"] == "tool-input-delta" and c["toolCallId"] == "c1"]
    assert json.loads("".join(pieces)) == {"query": "x"}


def test_a_reset_after_partial_tool_input_reopens_the_call_in_the_retried_attempt() -> None:
    _, chunks = run(
        (EventType.STEP_START, 0, {"attempt": 0}),
        (EventType.TOOL_INPUT_DELTA, 0, {"id": "c1", "name": "lookup", "text": '{"que'}),
        (EventType.STEP_RESET, 0, {"reason": "retrying after partial output"}),
        (EventType.STEP_RETRY, 0, {"attempt": 1, "countdown": 0.1, "error": "overloaded"}),
        (EventType.STEP_START, 0, {"attempt": 1}),
        (EventType.TOOL_INPUT_DELTA, 0, {"id": "c1", "name": "lookup", "text": '{"query": "x"}'}),
        (EventType.STEP_FINISH, 0, {}),
        (EventType.TOOL_CALL, 0, {"id": "c1", "name": "lookup", "args": {"query": "x"}}),
    )
    assert types(chunks) == [
        "start",
        "start-step",
        "tool-input-start",
        "tool-input-delta",
        "reset-step",  # the client drops the partial tool part (and its partial input state)
        "data-step-reset",
        "data-retry",
        "tool-input-start",  # the same call id opens a fresh part in the retried attempt
        "tool-input-delta",
        "tool-input-available",
    ]
