"""The provider-neutral adapter contract.

An adapter turns a canonical `StepRequest` into one streamed model call, calls
`emit` for every content delta, and returns the assistant message with usage and
finish reason. It classifies every failure as a `ProviderError` (retryable or
fatal, with an optional retry-after) and never retries by itself: the engine's
retry is the only one.

The data an adapter trades in (`ToolSpec`, `Delta`, `StepOutput`) is defined in
`stepq.models`, so the store can checkpoint a step's output without importing providers. What an adapter
factory reads of an agent is `AdapterAgent`, a protocol `AgentDefinition` satisfies structurally: providers
sit below the definitions and never import them.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from stepq.errors import DefinitionError
from stepq.errors import ProviderError as ProviderError  # adapters raise it; defined with the other errors
from stepq.models import OUTPUT_TOOL as OUTPUT_TOOL  # the tool an object-mode step answers through
from stepq.models import Delta, Message, StepOutput, ToolSpec

ToolChoice = Literal["auto", "none", "required"] | str  # a bare tool name forces that tool


class StepRequest(BaseModel):
    provider: str
    model: str
    system: str | None = None
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True  # False: ask for at most one tool call (where the API has a switch)
    max_tokens: int | None = None
    temperature: float | None = None
    stop_sequences: list[str] = Field(default_factory=list)
    output_schema: dict[str, Any] | None = None
    step: int = 0
    attempt: int = 0
    options: dict[str, Any] = Field(default_factory=dict)
    purpose: Literal["step", "summary"] = "step"  # summary: compaction's call that summarises older turns
    # provider-neutral sampling, mapped by each adapter (unset: `options` may still carry the provider's own)
    top_p: float | None = None
    reasoning_effort: str | None = None  # minimal | low | medium | high
    thinking_budget: int | None = None  # thinking tokens (0: off where the provider allows it)

    def sampling(self, name: str) -> Any:
        """A sampling field (`top_p`, `reasoning_effort`, `thinking_budget`): the step's provider-neutral
        value, else the agent's provider option of the same name."""
        value = getattr(self, name)
        return value if value is not None else self.options.get(name)


class AdapterAgent(Protocol):
    """What an adapter factory reads of the agent it builds an adapter for (`AgentDefinition` has it)."""

    @property
    def id(self) -> str: ...

    @property
    def provider_options(self) -> dict[str, Any]: ...


Emit = Callable[[Delta], None]
ShouldStop = Callable[[], bool]


class ProviderAdapter(ABC):
    """Base class for adapters. Subclasses implement `stream_step`; the rest have safe defaults."""

    name: str = "abstract"
    tool_failure_breaker: int | None = None  # the provider's preferred breaker (the agent may set one too)
    usage_is_measured: bool = True  # False for offline models whose token counts are stand-ins, not sizes
    # the provider-neutral sampling fields this adapter sends; a step setting another one is traced as not sent
    sampling_fields: frozenset[str] = frozenset({"temperature", "top_p", "reasoning_effort", "thinking_budget"})

    @abstractmethod
    def stream_step(self, request: StepRequest, emit: Emit, should_stop: ShouldStop) -> StepOutput:
        """Run one model call. Call `emit` per content delta; stop early (returning what was
        gathered) when `should_stop()` turns true. Raise `ProviderError` on failure."""

    def check_tools(self, tools: list[ToolSpec]) -> None:  # noqa: B027 - optional hook
        """Raise DefinitionError if a tool schema cannot be expressed for this provider."""

    def is_malformed(self, output: StepOutput) -> bool:
        """True when the step's output is a malformed tool call worth one corrective retry."""
        return False

    def count_tokens(self, request: StepRequest) -> int | None:
        """The request's input tokens from the provider's count endpoint; None when it has none (the engine
        then estimates). Raise ProviderError on failure."""
        return None

    def malformed_note(self) -> str:
        return "Your last function call was malformed. Call the function again with valid JSON arguments."

    def batch_api(self) -> BatchAPI | None:
        """The provider's batch API for this adapter's model, or None when it has none (steps run online)."""
        return None

    def use_credential(self, api_key: str) -> None:
        """Send this adapter's calls with a tenant's API key instead of the fleet's (see docs/operate/tenants.md); the
        providers that take one (anthropic, openai, openai-compatible) override it."""
        raise ProviderError(
            f"provider {self.name!r} takes no tenant API key; remove the tenant's key for it", retryable=False
        )


# --------------------------------------------------------------------------- provider batch APIs


BatchState = Literal["in_progress", "ended"]


class BatchAPI(ABC):
    """A provider's asynchronous batch endpoint: many step requests in, each one's answer out, later.

    The engine never calls it while a worker waits: a periodic task submits the requests that steps
    parked (`submit`), polls (`poll`), reads the answers (`results`) and cancels what ran past its
    deadline (`cancel`). Answers are mapped to `StepOutput` exactly like a streamed call's; a failed
    request is a `ProviderError` (retryable or not), classified like the streamed call's errors.
    """

    @abstractmethod
    def submit(self, local_id: str, requests: list[tuple[str, StepRequest]]) -> str:
        """Send one batch of (custom id, request); returns the provider's batch id. `local_id` names the
        batch where the API lets a client name it (so a retried submit can find the first one)."""

    @abstractmethod
    def poll(self, batch_id: str) -> BatchState:
        """Whether the provider finished the batch (every request answered, failed, cancelled or expired)."""

    @abstractmethod
    def results(self, batch_id: str) -> dict[str, StepOutput | ProviderError]:
        """Each request's answer by custom id; a request missing from the map is treated as expired."""

    @abstractmethod
    def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch (requests it already answered may still be read)."""


# --------------------------------------------------------------------------- tool declarations


TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # the name rule Anthropic, OpenAI and Bedrock share


def object_schema(spec: ToolSpec) -> dict[str, Any]:
    """The tool's JSON schema with an object at the root (an empty schema becomes one), as APIs that take
    a tool's arguments as one JSON object want it."""
    schema = dict(spec.input_schema or {})
    if not schema:
        return {"type": "object", "properties": {}}
    if "type" not in schema and ("properties" in schema or "required" in schema):
        schema["type"] = "object"
    return schema


def check_object_tools(specs: list[ToolSpec], *, vendor: str, provider: str, name_kind: str, schema_kind: str) -> None:
    """Raise DefinitionError for a tool such an API cannot be shown: a bad name, a duplicate, or a schema whose
    root is not an object. `name_kind`/`schema_kind` are the API's own words ("tool"/"an input schema")."""
    seen: set[str] = set()
    for spec in specs:
        if not TOOL_NAME.match(spec.name):
            raise DefinitionError(
                f"tool {spec.name!r}: {vendor} {name_kind} names must match ^[a-zA-Z0-9_-]{{1,64}}$; rename the tool"
            )
        if spec.name in seen:
            raise DefinitionError(f"tool {spec.name!r} is declared twice for the {provider} provider")
        seen.add(spec.name)
        if object_schema(spec).get("type") != "object":
            raise DefinitionError(
                f"tool {spec.name!r}: {vendor} needs {schema_kind} whose root is a JSON object "
                '({"type": "object", ...}); wrap the value in an object property'
            )
