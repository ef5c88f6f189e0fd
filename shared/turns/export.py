"""A turn as a self-contained case (`stepq export TURN`): what it was asked, each step's model answer and the
tool results recorded for it, and what it produced. `stepq.providers.replay` replays a case offline.

The case holds the transcript as stored (files by reference, never their bytes) and no approval tokens,
secrets or internal bookkeeping: it is safe to keep with a test suite as an evaluation built from real traffic.
"""

from __future__ import annotations

from typing import Any

from stepq.models import AssistantMessage, ToolResultMessage, TurnState
from stepq.providers.replay import CASE_VERSION
from stepq.turns.listings import origin_of


def export_case(state: TurnState) -> dict[str, Any]:
    """The case of a turn: JSON-able, in the shape `stepq.providers.replay.load_case` reads."""
    messages = state.messages
    starts = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
    first = starts[0] if starts else len(messages)
    steps = []
    for number, index in enumerate(starts):
        after = messages[index + 1] if index + 1 < len(messages) else None
        results = after.results if isinstance(after, ToolResultMessage) else []
        steps.append(
            {
                "step": number,
                "assistant": messages[index].model_dump(mode="json"),
                "tool_results": [r.model_dump(mode="json") for r in results],
            }
        )
    return {
        "stepq_case": CASE_VERSION,
        "turn_id": state.turn_id,
        "agent": state.agent,
        "provider": state.provider,
        "model": state.model,
        "status": state.status.value,
        "finish_reason": state.finish_reason.value if state.finish_reason else None,
        "origin": origin_of(state),
        "input": [m.model_dump(mode="json") for m in messages[:first]],
        "steps": steps,
        "result": {"text": state.text, "object": state.object},
    }
