"""Agents for tests/test_compaction.py: a scripted turn whose tool results outgrow a small context window."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall


@tool
def cp_blob(n: int) -> str:
    """Return a long document (3,000 characters) tagged with n."""
    return f"doc-{n}:" + "z" * 3000


long_turn = AgentDefinition(
    id="cp.long_turn",
    allowed_tools=["cp_blob"],
    loop=LoopConfig(max_steps=12),
    script=[
        *[
            ScriptStep(text=f"reading {n}", tool_calls=[ScriptToolCall(id=f"b{n}", name="cp_blob", args={"n": n})])
            for n in range(8)
        ],
        ScriptStep(text="all read"),
    ],
)


@tool
def cp_lookup(n: int) -> str:
    """Look item n up (a long record)."""
    return "r" * 4000


def _wire_agent(provider: str, model: str) -> AgentDefinition:
    return AgentDefinition(
        id=f"cp.{provider}",
        system_prompt="You are a terse test assistant.",
        allowed_tools=["cp_lookup"],
        default_provider=provider,
        default_model=model,
    )


WIRE_MODELS = {
    "anthropic": "claude-cp",
    "gemini": "gemini-cp",
    "bedrock": "anthropic.claude-cp-v1:0",
    "openai": "gpt-cp",
}
wire_anthropic = _wire_agent("anthropic", WIRE_MODELS["anthropic"])
wire_gemini = _wire_agent("gemini", WIRE_MODELS["gemini"])
wire_bedrock = _wire_agent("bedrock", WIRE_MODELS["bedrock"])
wire_openai = _wire_agent("openai", WIRE_MODELS["openai"])


def long_transcript(rounds: int = 6) -> list[dict[str, object]]:
    """A conversation of `rounds` question / tool call / long result / answer cycles, then a new question."""
    messages: list[dict[str, object]] = []
    for i in range(rounds):
        call = {"type": "tool-call", "id": f"call_{i}", "name": "cp_lookup", "args": {"n": i}}
        messages += [
            {"role": "user", "content": f"question {i}: " + "q" * 2000},
            {"role": "assistant", "parts": [{"type": "text", "text": f"looking {i}"}, call]},
            {"role": "tool", "results": [{"tool_call_id": f"call_{i}", "name": "cp_lookup", "output": "r" * 4000}]},
            {"role": "assistant", "parts": [{"type": "text", "text": f"answer {i}"}]},
        ]
    messages.append({"role": "user", "content": "final question"})
    return messages


thread_chat = AgentDefinition(
    id="cp.thread_chat",
    allowed_tools=["cp_blob"],
    # every turn of the thread: one lookup (its call id repeats from turn to turn), then an answer
    script=[
        ScriptStep(text="reading", tool_calls=[ScriptToolCall(name="cp_blob", args={"n": 1})]),
        ScriptStep(text="ok"),
    ],
)
