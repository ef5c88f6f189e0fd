"""Agents for the rate-limit, priority and batch tests."""

from __future__ import annotations

from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import tool
from stepq.fleet.ratelimit import RateLimit
from stepq.models import AssistantMessage, Delta, StepOutput, TextPart, Usage, UserMessage
from stepq.providers.base import Emit, ProviderAdapter, ShouldStop, StepRequest
from stepq.providers.registry import register_provider
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall

limited = AgentDefinition(
    id="bt.limited",
    rate_limit=RateLimit(rpm=3, window_s=2.0),
    script=[ScriptStep(text="ok")],
)

throttled = AgentDefinition(
    id="bt.throttled",
    default_model="throttled-model",
    rate_limit=RateLimit(rpm=100, penalty_factor=0.5, penalty_s=30),
    script=[ScriptStep(text="ok", fail=ScriptFailure(when="before", status=429, retry_after_s=5.0))],
)

same_model = AgentDefinition(
    id="bt.same_model",
    default_model="throttled-model",
    rate_limit=RateLimit(rpm=100),
    script=[ScriptStep(text="ok")],
)

one_at_a_time = AgentDefinition(
    id="bt.one_at_a_time",
    default_model="solo-model",
    rate_limit=RateLimit(concurrency=1),
    script=[ScriptStep(text="ok")],
)

chat = AgentDefinition(id="bt.chat", script=[ScriptStep(text="hello there", delta_chars=4)])

batch_item = AgentDefinition(
    id="bt.batch_item",
    priority="batch",
    script=[ScriptStep(text="0123456789", delta_chars=5, delta_delay_s=0.05)],
)


@tool
def bt_noop() -> str:
    """Does nothing (keeps the tool registry non-empty for the extractor)."""
    return "ok"


class BtContact(BaseModel):
    name: str
    email: str


extract = AgentDefinition(
    id="bt.extract",
    priority="batch",
    execution_mode="object",
    output=BtContact,
    default_provider="bt-extract",
    default_model="regex",
)


def _extract_factory(agent: AgentDefinition, model: str) -> ProviderAdapter:
    return _RegexExtractor()


class _RegexExtractor(ProviderAdapter):
    """A deterministic offline model that 'extracts' name and email from the prompt, so each item differs."""

    name = "bt-extract"

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        import json
        import re

        prompt = next(m.content for m in request.messages if isinstance(m, UserMessage))
        text = json.loads(prompt)["text"]
        match = re.match(r"(.*) <(.*)>", text)
        answer = json.dumps({"name": match.group(1), "email": match.group(2)}) if match else "{}"
        emit(Delta("text", answer))
        return StepOutput(
            message=AssistantMessage(parts=[TextPart(text=answer)]),
            usage=Usage(input_tokens=len(prompt) // 4 + 1, output_tokens=len(answer) // 4 + 1),
        )


register_provider("bt-extract", _extract_factory)

anthropic_limited = AgentDefinition(
    id="bt.anthropic_limited",
    default_provider="anthropic",
    default_model="claude-limited",
    rate_limit=RateLimit(rpm=3, window_s=2.0),
)


@tool(needs_approval=True)
def bt_publish(label: str) -> str:
    """Publish an item (a write: needs approval)."""
    return f"published {label}"


gated = AgentDefinition(
    id="bt.gated",
    priority="batch",
    allowed_tools=["bt_publish"],
    read_only=False,
    script=[
        ScriptStep(tool_calls=[ScriptToolCall(name="bt_publish", args={"label": "item"})]),
        ScriptStep(text="done"),
    ],
)
