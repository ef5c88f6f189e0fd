"""Native structured output for object-mode agents.

The engine offers the output schema to the model as one extra tool, `stepq_output`,
and forces it on the step reserved for the answer (the last allowed step, a repair
step, or any step when the agent has no tools of its own). Providers with a forced
tool choice (Anthropic, Bedrock) need nothing more; Gemini turns a forced
`stepq_output` into its response schema + JSON output instead. A call to
`stepq_output` becomes the step's final answer as JSON text, validated like any answer.
"""

from __future__ import annotations

import json
from typing import Any

from stepq.agents.definition import OUTPUT_WRAPPER, AgentDefinition
from stepq.models import AssistantMessage, FinishReason, StepOutput, TextPart, ToolSpec, TurnState, UserMessage
from stepq.providers.base import OUTPUT_TOOL


def output_tool(agent: AgentDefinition) -> ToolSpec:
    """The answer tool (its shape belongs to the definition: agent loading checks it per provider)."""
    return agent.output_tool()


def must_answer_now(agent: AgentDefinition, state: TurnState, has_tools: bool) -> bool:
    """The step reserved for the output: no tools to use, the last allowed step, or a repair step."""
    last_step = state.step + 1 >= state.limits.max_steps
    repairing = bool(state.repairs_used) and isinstance(state.messages[-1], UserMessage)
    return not has_tools or last_step or repairing or state.answer_due is not None


def as_answer(agent: AgentDefinition, output: StepOutput) -> StepOutput | None:
    """If the model called `stepq_output`, the step's answer as JSON text; else None."""
    call = next((c for c in output.message.tool_calls if c.name == OUTPUT_TOOL), None)
    if call is None:
        return None
    args: Any = call.args
    if (agent.output_schema() or {}).get("type") != "object" and set(args) == {OUTPUT_WRAPPER}:
        args = args[OUTPUT_WRAPPER]
    text = json.dumps(args, ensure_ascii=False)
    return output.model_copy(
        update={"message": AssistantMessage(parts=[TextPart(text=text)]), "finish_reason": FinishReason.STOP}
    )
