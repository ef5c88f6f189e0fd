"""Compaction in-process against real Redis (scripted model, a small context window from
STEPQ_CONTEXT_WINDOWS): a turn whose tool results would overflow it first has older results cut, then
older turns summarised by a traced model call; pairs are never split; the turn's own transcript stays
whole; the compaction is stored with the turn; `context-compacted` says what was removed."""

from __future__ import annotations

from stepq.engine.compaction import context_window, view
from stepq.fleet.runtime import get_runtime
from stepq.models import AssistantMessage, ToolResultMessage, TurnStatus, UserMessage
from tests.agents_engine import drive, start
from tests.conftest import make_settings


def assert_pairs_intact(messages) -> None:
    """Every tool result answers the calls of the assistant message right before it, and every call is answered."""
    assert isinstance(messages[0], UserMessage)
    for i, m in enumerate(messages):
        if isinstance(m, ToolResultMessage):
            before = messages[i - 1]
            assert isinstance(before, AssistantMessage)
            assert {r.tool_call_id for r in m.results} == {c.id for c in before.tool_calls}
        elif isinstance(m, AssistantMessage) and m.tool_calls and i + 1 < len(messages):
            assert isinstance(messages[i + 1], ToolResultMessage)


def test_the_context_window_comes_from_the_override_then_the_table(prefix):
    s = make_settings(prefix, context_windows={"anthropic/claude-x": 1000, "gpt-4o-mini": 2000})
    assert context_window(s, "anthropic", "claude-x") == 1000
    assert context_window(s, "openai", "gpt-4o-mini") == 2000
    assert context_window(s, "anthropic", "claude-sonnet-4-5") == 200_000
    assert context_window(s, "gemini", "gemini-1.5-pro-002") == 2_097_152
    assert context_window(s, "scripted", "scripted") is None  # unknown: never compacted


def test_a_long_turn_is_compacted_and_keeps_its_whole_transcript(prefix):
    rt = get_runtime(make_settings(prefix, context_windows={"scripted": 3000}, compact_at=0.8))
    turn_id = start(rt, "cp.long_turn", prefix)
    state = drive(rt, turn_id)
    assert state.status == TurnStatus.COMPLETED and state.text == "all read"

    # the record keeps everything: every tool result whole
    outputs = [r.output for m in state.messages if isinstance(m, ToolResultMessage) for r in m.results]
    assert len(outputs) == 8 and all(len(o) > 3000 for o in outputs)
    assert state.result().trace.steps  # (the result is built from the whole transcript)

    events = [e for e in rt.events.read(turn_id) if e.type == "context-compacted"]
    assert events, "the turn should have been compacted"
    for e in events:
        assert e.data["tokens_after"] < e.data["tokens_before"]
        assert e.data["tokens_before"] > e.data["limit"] == 2400 and e.data["counted_by"] == "estimate"
    assert events[0].data["tool_results_cut"] and events[0].data["messages_summarised"] == 0  # stage 1 first
    summarised = [e for e in events if e.data["messages_summarised"]]
    assert summarised, "the results alone were not enough: older turns were summarised"

    # the summary call is a traced step, counted in the turn's usage
    compactions = [t for t in state.trace.steps if t.kind == "compaction"]
    assert len(compactions) == len(summarised)
    assert all(t.usage.input_tokens > 0 for t in compactions)
    assert state.usage.input_tokens >= sum(t.usage.input_tokens for t in state.trace.steps)

    # what the model sees now: a summary first, pairs intact, and within the limit
    compaction = state.compaction
    assert compaction is not None and compaction.summary and compaction.summary.startswith("summary of")
    seen = view(state)
    assert isinstance(seen[0], UserMessage) and "summarised" in seen[0].content
    assert_pairs_intact(seen)
    assert len(seen) < len(state.messages)
    assert sum(len(m.model_dump_json()) for m in seen) < sum(len(m.model_dump_json()) for m in state.messages)

    # stored with the turn: a fresh load (what a redelivered step reads) sees the same view
    reloaded = rt.turns.load(turn_id)
    assert reloaded is not None and reloaded.compaction == compaction and view(reloaded) == seen


def test_no_compaction_under_the_limit_or_when_turned_off(prefix):
    for overrides in (
        {"context_windows": {"scripted": 1_000_000}},
        {"context_windows": {"scripted": 3000}, "compact_at": 0},
    ):
        rt = get_runtime(make_settings(prefix, **overrides))
        turn_id = start(rt, "cp.long_turn", prefix)
        state = drive(rt, turn_id)
        assert state.status == TurnStatus.COMPLETED and state.compaction is None
        assert not [e for e in rt.events.read(turn_id) if e.type == "context-compacted"]


def test_a_long_thread_is_compacted_per_turn_and_keeps_its_whole_history(prefix):
    from stepq.turns.threads import continue_thread, create_thread, get_thread

    rt = get_runtime(make_settings(prefix, context_windows={"scripted": 3000}))
    thread = create_thread(rt, "cp.thread_chat", metadata={"prefix": prefix})
    compacted_turns = 0
    for i in range(6):
        continued = continue_thread(rt, thread.thread_id, prompt=f"message {i}")
        state = drive(rt, continued.state.turn_id)
        assert state.status == TurnStatus.COMPLETED and state.text == "ok"
        if state.compaction is not None:
            compacted_turns += 1
            assert_pairs_intact(view(state))
            seen = sum(len(m.model_dump_json()) for m in view(state))
            assert seen < sum(len(m.model_dump_json()) for m in state.messages)
    assert compacted_turns >= 2  # later turns start over the limit: each compacts what its model sees

    # the thread's history is the whole conversation: every prompt, every result uncut
    history = get_thread(rt, thread.thread_id).messages
    assert [m.content for m in history if isinstance(m, UserMessage)] == [f"message {i}" for i in range(6)]
    results = [r.output for m in history if isinstance(m, ToolResultMessage) for r in m.results]
    assert len(results) == 6 and all(len(o) > 3000 for o in results)
