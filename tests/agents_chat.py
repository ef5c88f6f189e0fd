"""Agents for the chat tests (the AI SDK conformance test and the browser test), on the scripted provider.

`chat_wait` holds its step until the test releases it (a BLPOP on a key named after the turn), so a test
can reload a page or drop a connection while a turn is provably still running, with no timing guesses.
"""

from __future__ import annotations

import redis
from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import ToolContext, tool
from stepq.models import Delta, StepOutput, ToolInputDelta
from stepq.providers.base import Emit, ShouldStop, StepRequest
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall

REDIS_URL = "redis://127.0.0.1:6379/0"
_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
GATE_TIMEOUT_S = 120


def gate_key(tenant: str, turn_id: str) -> str:
    """The key `chat_wait` waits on; the chat tests give each session a tenant named after its key prefix."""
    return f"{tenant}:gate:{turn_id}"


@tool
def chat_lookup(key: str) -> dict[str, str]:
    """Look a word up."""
    return {"key": key, "value": {"alpha": "the first letter"}.get(key, "unknown")}


@tool(is_mutation=True)
def chat_record(label: str) -> dict[str, str]:
    """Record a label (a write: needs approval)."""
    return {"recorded": label}


@tool
def chat_wait(ctx: ToolContext) -> dict[str, bool]:
    """Wait until the test releases this turn."""
    released = _redis.blpop([gate_key(str(ctx.metadata.get("tenant")), ctx.turn_id)], timeout=GATE_TIMEOUT_S)
    return {"released": released is not None}


plain = AgentDefinition(
    id="chat.plain",
    description="Thinks, then answers in one streamed step.",
    script=[
        ScriptStep(
            reasoning="Thinking it over before answering.",
            text="Hello from stepq: this answer streams to the chat in several small pieces.",
            delta_delay_s=0.02,  # model latency: the deltas arrive apart, as a real model's do
        )
    ],
)

tools = AgentDefinition(
    id="chat.tools",
    allowed_tools=["chat_lookup"],
    script=[
        ScriptStep(text="Looking it up.", tool_calls=[ScriptToolCall(name="chat_lookup", args={"key": "alpha"})]),
        ScriptStep(text="Alpha is the first letter."),
    ],
)

LONG_KEY = "alpha, asked about at some length so that the argument streams in several pieces"


def _long_lookup(request: FunctionRequest) -> FunctionResponse:
    """Calls `chat_lookup` with a long argument (its JSON streams as tool input), then answers."""
    if "chat_lookup" in request.called:
        return FunctionResponse(text="Looked it up.")
    call = ScriptToolCall(name="chat_lookup", args={"key": LONG_KEY})
    return FunctionResponse(tool_calls=[call], delta_delay_s=0.02)  # pieces arrive apart, as a model's do


tool_input = AgentDefinition(
    id="chat.tool_input",
    description="Streams a tool call's long argument before the call.",
    allowed_tools=["chat_lookup"],
    function_model=FunctionModel(_long_lookup),
)

HELD_PIECES = 2  # tool-input pieces `chat.held_input` streams before it holds its step


class _HeldInput(FunctionModel):
    """`_long_lookup`, holding its step after the first HELD_PIECES pieces of the call's argument until the
    test pushes to the key the prompt names (`hold <key>`): a test can look at a half-streamed call."""

    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        prompt = FunctionRequest(list(request.messages), tools=[], output_schema=None, answer_now=False).prompt
        key = prompt.rsplit("hold ", 1)[-1].strip()
        pieces = 0

        def held(delta: Delta) -> None:
            nonlocal pieces
            if isinstance(delta, ToolInputDelta):
                pieces += 1
                if pieces == HELD_PIECES + 1:
                    _redis.blpop([key], timeout=GATE_TIMEOUT_S)
            emit(delta)

        return super().stream_step(request, held, should_stop)


held_input = AgentDefinition(
    id="chat.held_input",
    description="Streams part of a tool call's argument, then waits for the test before the rest.",
    allowed_tools=["chat_lookup"],
    function_model=_HeldInput(_long_lookup),
)

gated = AgentDefinition(
    id="chat.gated",
    allowed_tools=["chat_record"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(text="I will record it.", tool_calls=[ScriptToolCall(name="chat_record", args={"label": "audit"})]),
        ScriptStep(text="That is settled."),
    ],
)

gate = AgentDefinition(
    id="chat.gate",
    allowed_tools=["chat_wait"],
    loop=LoopConfig(max_steps=3),
    script=[
        ScriptStep(text="First part, streamed before the gate.", tool_calls=[ScriptToolCall(name="chat_wait")]),
        ScriptStep(text="Second part, after the gate opened."),
    ],
)

reset = AgentDefinition(
    id="chat.reset",
    retry_after_emission=True,
    script=[
        ScriptStep(
            text="This sentence streams, breaks, and streams again.",
            fail=ScriptFailure(when="after-content", status=529, message="overloaded mid-stream"),
        )
    ],
)

slow = AgentDefinition(
    id="chat.slow",
    script=[
        ScriptStep(
            text="One slow sentence, streamed a few characters at a time, long enough to kill its worker.",
            delta_chars=3,
            delta_delay_s=0.1,  # model latency: about 3 s of streaming
        )
    ],
)

gated_two = AgentDefinition(
    id="chat.gated_two",
    allowed_tools=["chat_record"],
    read_only=False,
    mutation_policy="confirm-required",
    script=[
        ScriptStep(
            text="Two records.",
            tool_calls=[
                ScriptToolCall(name="chat_record", args={"label": "one"}),
                ScriptToolCall(name="chat_record", args={"label": "two"}),
            ],
        ),
        ScriptStep(text="Both handled."),
    ],
)

fails = AgentDefinition(
    id="chat.fails",
    script=[
        ScriptStep(
            text="This answer breaks halfway through.",
            fail=ScriptFailure(when="after-content", status=529, message="overloaded mid-stream"),
        )
    ],
)

planned = AgentDefinition(
    id="chat.plan",
    description="States a plan, looks a word up, answers: the plan streams as a data-plan part.",
    task_plan=True,
    allowed_tools=["chat_lookup"],
    script=[
        ScriptStep(
            text="Planning.",
            tool_calls=[
                ScriptToolCall(
                    name="update_task_plan",
                    args={
                        "steps": [
                            {"label": "Look up alpha", "status": "pending", "tool_name": "chat_lookup"},
                            {"label": "Answer", "status": "pending"},
                        ]
                    },
                )
            ],
        ),
        ScriptStep(tool_calls=[ScriptToolCall(name="chat_lookup", args={"key": "alpha"})]),
        ScriptStep(text="Alpha is the first letter."),
    ],
)


class Card(BaseModel):
    name: str
    email: str


repair = AgentDefinition(
    id="chat.repair",
    description="Object mode: its first answer misses a field, so a repair step answers again.",
    execution_mode="object",
    output=Card,
    script=[
        ScriptStep(object={"name": "Ada Lovelace"}),  # no email: invalid, so a repair step follows
        ScriptStep(object={"name": "Ada Lovelace", "email": "ada@engines.example"}),
    ],
)


suggests = AgentDefinition(
    id="chat.suggests",
    description="Offers starter prompts; answers in Markdown, with a code block and HTML it must not run.",
    suggestions=["What can you do?", {"label": "Show me some code", "prompt": "show me a code sample"}],
    script=[
        ScriptStep(
            text=(
                "## Here it is\n\nSome **bold** text and a list:\n\n- one\n- two\n\n"
                "```python\nprint('hi')\n```\n\n"
                'Raw HTML stays text: <img src="x" onerror="window.__pwned = 1"> '
                "<script>window.__pwned = 2</script> [a link](javascript:window.__pwned=3)"
            )
        )
    ],
)


card = AgentDefinition(
    id="abstract.card",  # sorts first in GET /v1/agents, as an object-mode batch agent does in the demo
    description="Object mode: a contact card for a pipeline; not one to chat with.",
    execution_mode="object",
    output=Card,
    script=[ScriptStep(object={"name": "Ada Lovelace", "email": "ada@engines.example"})],
)
