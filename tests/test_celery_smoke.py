"""A full turn through a real Celery worker and real Redis."""

from __future__ import annotations

from stepq.models import EventType, FinishReason, TurnStatus


def test_basic_turn_through_celery(worker, client, prefix):
    handle = client.submit("rt.basic", prompt="hello", metadata={"prefix": prefix})
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED
    assert result.finish_reason == FinishReason.STOP
    assert result.text == "all done here, thanks"
    events = list(handle.events())
    types = [e.type for e in events]
    assert types[0] == EventType.TURN_START and types[-1] == EventType.TURN_FINISH
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert EventType.TOOL_RESULT in types
    assert len(result.trace.steps) == 2
    assert result.usage.input_tokens == sum(s.usage.input_tokens for s in result.trace.steps)
