"""The agent's `repair_tool_call` hook: a malformed tool call is handed to it once, before anything else sees it.

A call is malformed when its arguments are not a JSON object (the adapter keeps the raw text as
`provider_data["invalid_json"]`), name no tool the step shows, or fail the tool's schema. The hook runs on the
worker, once per such call, right after the model answered: what it returns replaces the call (same id) in
the answer, so the trace, the checkpoint, the transcript and the dispatch all see the repaired call, and the
repaired call is validated and gated like any other (a repair never skips an approval). None, or a hook that
raises, keeps the call as the model sent it: the corrective retry (invalid JSON) or the error result the
model reads (unknown tool, bad arguments), as without a hook.
"""

from __future__ import annotations

import logging

from stepq.agents.definition import AgentDefinition, RepairToolCall
from stepq.agents.tools import ToolDefinition
from stepq.errors import ToolArgumentError
from stepq.models import OUTPUT_TOOL, AssistantPart, StepOutput, ToolCall

log = logging.getLogger("stepq.engine")


def problem(call: ToolCall, shown: dict[str, ToolDefinition]) -> str | None:
    """What is wrong with a call, in the words the hook gets, or None when it can be dispatched as it is."""
    if call.name == OUTPUT_TOOL:  # object mode's answer: repaired against its schema by the answer stage
        return None
    raw = (call.provider_data or {}).get("invalid_json")
    if raw is not None:
        return f"the arguments of {call.name} are not a JSON object: {str(raw)[:200]}"
    definition = shown.get(call.name)
    if definition is None:
        return f"no tool named {call.name!r} is available on this step (available: {', '.join(shown) or 'none'})"
    try:
        definition.validate(call.args)
    except ToolArgumentError as exc:
        return f"invalid arguments for {call.name}: {exc}"
    return None


def repair_calls(
    agent: AgentDefinition, output: StepOutput, shown: dict[str, ToolDefinition]
) -> tuple[StepOutput, list[str]]:
    """The answer with each malformed call replaced by the hook's repair, and the ids of the calls it repaired."""
    hook = agent.repair_tool_call
    if hook is None or not output.message.tool_calls:
        return output, []
    repaired: list[str] = []
    parts: list[AssistantPart] = []
    for part in output.message.parts:
        error = problem(part, shown) if isinstance(part, ToolCall) else None
        if isinstance(part, ToolCall) and error is not None:
            fixed = _ask(agent, hook, part, error)
            if fixed is not None:  # it keeps the call's id (results pair by it), and is no longer malformed
                data = {k: v for k, v in (fixed.provider_data or {}).items() if k != "invalid_json"} or None
                part = fixed.model_copy(update={"id": part.id, "provider_data": data})
                repaired.append(part.id)
        parts.append(part)
    if not repaired:
        return output, []
    message = output.message.model_copy(update={"parts": parts})
    return output.model_copy(update={"message": message}), repaired


def _ask(agent: AgentDefinition, hook: RepairToolCall, call: ToolCall, error: str) -> ToolCall | None:
    try:
        fixed = hook(call.model_copy(deep=True), error)
    except Exception:
        log.exception("repair_tool_call of agent %s raised on call %s; the call stays as sent", agent.id, call.id)
        return None
    if fixed is None or isinstance(fixed, ToolCall):
        return fixed
    log.warning("repair_tool_call of agent %s returned %s, not a ToolCall or None", agent.id, type(fixed).__name__)
    return None
