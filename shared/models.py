"""Canonical, provider-neutral data: transcript, usage, events, trace, turn state.

Everything here round-trips through JSON, because all of it lives in Redis and
crosses process boundaries. Adapters translate these to and from wire formats.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from stepq.errors import StepqError

# --------------------------------------------------------------------------- transcript

OUTPUT_TOOL = "stepq_output"  # the tool an object-mode step answers through (see shared/engine/structured.py)


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ReasoningPart(BaseModel):
    """Model reasoning; `signature` / `data` are opaque and sent back verbatim to the same provider."""

    type: Literal["reasoning"] = "reasoning"
    text: str = ""
    signature: str | None = None
    redacted_data: str | None = None
    provider: str | None = None


class ToolCall(BaseModel):
    type: Literal["tool-call"] = "tool-call"
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    provider_data: dict[str, Any] | None = None  # e.g. a Gemini thought signature on the call


AssistantPart = Annotated[TextPart | ReasoningPart | ToolCall, Field(discriminator="type")]


class SystemMessage(BaseModel):
    role: Literal["system"] = "system"
    content: str


# The media types a FilePart may carry (attachments check uploads against them, definitions their
# `accepted_media_types`): data, so both read it here and neither imports the other.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
DOCUMENT_TYPES = frozenset({"application/pdf", "text/plain"})
SUPPORTED_TYPES = IMAGE_TYPES | DOCUMENT_TYPES


class FilePart(BaseModel):
    """A file in a user message (an image, a PDF or a plain-text file), held by reference.

    The transcript keeps only the reference: `attachment_id` (stored once by stepq with the turn) or `url`
    (an allowlisted http(s) URL the worker fetches, or a `gs://` object Gemini reads itself). `data`
    (base64) is set only on the way in, before submit stores the bytes, and on the way out, when the
    worker fills it in for the one provider call; it is never stored in the transcript."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["file"] = "file"
    media_type: str
    attachment_id: str | None = None
    url: str | None = None
    data: str | None = None
    name: str | None = None
    size: int | None = None


class UserMessage(BaseModel):
    """A user message: text, plus any files. `content` may be given as a list of parts, as chat APIs send
    it (`[{"type": "text", ...}, {"type": "file", ...}]`): the texts join and the files move to `files`."""

    role: Literal["user"] = "user"
    content: str
    files: list[FilePart] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_parts(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("content"), list):
            return value
        texts: list[Any] = []
        files: list[Any] = list(value.get("files") or [])
        for part in value["content"]:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "file":
                files.append({k: v for k, v in part.items()})
            elif kind == "text" and set(part) <= {"type", "text"}:
                texts.append(part.get("text"))
            else:
                return value  # not a part this message knows: validation names it
        if not all(isinstance(t, str) for t in texts):
            return value
        return {**value, "content": "\n\n".join(texts), "files": files}

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A message without files serializes as it always did (no empty `files` in every stored message)."""
        data = handler(self)
        if isinstance(data, dict) and not self.files:
            data.pop("files", None)
        return data


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    parts: list[AssistantPart] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]


class ToolResultStatus(StrEnum):
    """How a tool call ended: what metrics and callers branch on (never the error text)."""

    OK = "ok"
    FAILED = "failed"  # the tool raised or timed out
    INVALID_ARGUMENTS = "invalid_arguments"  # the model's arguments did not match the schema; not run
    NOT_FOUND = "not_found"  # the model called a tool it was not shown
    PERMANENTLY_FAILED = "permanently_failed"  # the failure breaker blocks the tool for this turn; not run
    DENIED = "denied"  # approval-gated and denied, expired, or approved for other arguments; not run


class ToolResult(BaseModel):
    tool_call_id: str
    name: str
    output: Any = None  # what the model reads
    is_error: bool = False
    status: ToolResultStatus = ToolResultStatus.OK


class PlanStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


class PlanStep(BaseModel):
    """One row of an agent's visible task plan (see stepq.agents.task_plan): a short user-facing label."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=120)
    status: PlanStatus = PlanStatus.PENDING
    tool_name: str | None = Field(default=None, max_length=128)  # the tool whose calls advance this row


class ToolResultMessage(BaseModel):
    role: Literal["tool"] = "tool"
    results: list[ToolResult]


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="role")]


def carry_files(messages: Iterable[Message]) -> bool:
    """Whether any of `messages` is a user message with files (only user messages carry them)."""
    return any(isinstance(m, UserMessage) and m.files for m in messages)


def closed_transcript(messages: list[Message]) -> list[Message]:
    """The transcript with every tool call answered by the tool message right after it: a call the turn ended
    before answering (cancelled, out of budget, an object-mode answer) gets a result saying so, and results
    with no call before them are dropped. Providers refuse anything else, so this is what a thread keeps and
    what `TurnResult.messages` returns (the form `submit(messages=...)` accepts)."""
    out: list[Message] = []
    for message in messages:
        open_calls = _open_calls(out)
        if isinstance(message, ToolResultMessage):
            if not open_calls:
                continue
            given = {r.tool_call_id: r for r in message.results}
            out.append(ToolResultMessage(results=[given.get(c.id) or _not_run(c) for c in open_calls]))
            continue
        if open_calls:
            out.append(ToolResultMessage(results=[_not_run(c) for c in open_calls]))
        out.append(message)
    open_calls = _open_calls(out)
    if open_calls:
        out.append(ToolResultMessage(results=[_not_run(c) for c in open_calls]))
    return out


def _open_calls(messages: list[Message]) -> list[ToolCall]:
    """The tool calls of the last message when it is an assistant message that asked for tools."""
    last = messages[-1] if messages else None
    return last.tool_calls if isinstance(last, AssistantMessage) else []


def _not_run(call: ToolCall) -> ToolResult:
    if call.name == OUTPUT_TOOL:  # an object-mode answer: delivered, nothing was left undone
        return ToolResult(tool_call_id=call.id, name=call.name, output="recorded")
    error = "not run: the turn ended before this tool call was answered"
    return ToolResult(
        tool_call_id=call.id,
        name=call.name,
        output={"error": error, "status": ToolResultStatus.FAILED.value},
        is_error=True,
        status=ToolResultStatus.FAILED,
    )


# --------------------------------------------------------------------------- usage


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        def opt(a: int | None, b: int | None) -> int | None:
            total = (a or 0) + (b or 0)
            return total or None  # a sum of 0 collapses to None: "not reported" stays distinguishable

        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=opt(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens=opt(self.cache_write_tokens, other.cache_write_tokens),
            reasoning_tokens=opt(self.reasoning_tokens, other.reasoning_tokens),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


# --------------------------------------------------------------------------- status vocabulary


class TurnStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"  # parked: a gated tool call waits for a person's decision
    AWAITING_TOOL_RESULTS = "awaiting_tool_results"  # parked: client-side tool calls wait for Client.resume
    AWAITING_BATCH = "awaiting_batch"  # the step's model request waits in a provider batch (no worker held)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED)

    @property
    def parked(self) -> bool:
        """The turn holds no worker: it waits for approvals or for tool results from its caller."""
        return self in (TurnStatus.AWAITING_APPROVAL, TurnStatus.AWAITING_TOOL_RESULTS)


class StepLoss(StrEnum):
    """Why a delivery gave its step up to another one: a Decision's reason that metrics count apart."""

    COMMIT_LOST = "commit lost to a concurrent writer"  # another delivery committed the step first
    LEASE_LOST = "lease lost mid-step; another delivery owns the turn"  # the heartbeat could not renew it


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool-calls"
    CONTENT_FILTER = "content-filter"
    ERROR = "error"
    MAX_STEPS = "max-steps"
    BUDGET = "budget"  # which budget: `stopped_by`
    STEP_COUNT = "step-count"  # StopWhen(step_count=...)
    HAS_TOOL_CALL = "has-tool-call"  # StopWhen(has_tool_call=...)
    CUSTOM_STOP = "custom-stop"  # StopWhen(custom=...): `stop_detail` names the condition
    CANCELLED = "cancelled"
    AWAITING_APPROVAL = "awaiting-approval"
    QUOTA_EXCEEDED = "quota-exceeded"  # a tenant's usage quota was spent before a model call (docs/operate/tenants.md)


class LoopStop(StrEnum):
    """Which loop limit ended a turn (`stopped_by`); None when the model simply answered.

    In chat mode the turn ends at once (finish reason `tool-calls`, `max-steps` or `budget`). In object
    mode the loop first spends one reserved answer step (tools off, schema forced): the turn then keeps
    the answer's finish reason, and `stopped_by` still names the limit that cut the tool steps short."""

    STEP_COUNT = "step-count"  # StopWhen(step_count=...)
    HAS_TOOL_CALL = "has-tool-call"  # StopWhen(has_tool_call=...)
    CUSTOM = "custom-stop"  # StopWhen(custom=...)
    MAX_STEPS = "max-steps"
    TOKEN_BUDGET = "token-budget"
    TOOL_CALL_BUDGET = "tool-call-budget"
    WALL_CLOCK_BUDGET = "wall-clock-budget"

    @property
    def finish_reason(self) -> FinishReason:
        """The finish reason of a chat-mode turn this limit ends: each stop condition and `max-steps` its
        own; the three budgets `budget` (`stopped_by` says which)."""
        own = {
            LoopStop.STEP_COUNT: FinishReason.STEP_COUNT,
            LoopStop.HAS_TOOL_CALL: FinishReason.HAS_TOOL_CALL,
            LoopStop.CUSTOM: FinishReason.CUSTOM_STOP,
            LoopStop.MAX_STEPS: FinishReason.MAX_STEPS,
        }
        return own.get(self, FinishReason.BUDGET)


# --------------------------------------------------------------------------- one model call


class ToolSpec(BaseModel):
    """A tool as declared to the model: name, description, JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]
    strict: bool = False  # provider-native strict arguments (OpenAI, Anthropic); others validate in the engine


@dataclass(frozen=True)
class Delta:
    """A streamed piece: answer text, reasoning, a fragment of the structured answer's JSON, or (as
    `ToolInputDelta`) a fragment of a tool call's argument JSON."""

    kind: Literal["text", "reasoning", "object", "tool-input"]
    text: str


@dataclass(frozen=True)
class ToolInputDelta(Delta):
    """A fragment of one tool call's argument JSON as the model writes it (kind `tool-input`). Its own class so
    a text delta carries no call fields: the hot path builds and reads only `kind` and `text`."""

    call_id: str
    tool_name: str


def tool_input(call_id: str, tool_name: str, text: str) -> ToolInputDelta:
    """The `tool-input` delta of `text`, a piece of call `call_id`'s arguments."""
    return ToolInputDelta("tool-input", text, call_id, tool_name)


class StepOutput(BaseModel):
    """What one model call produced; also the checkpoint a step keeps until it commits."""

    message: AssistantMessage
    usage: Usage = Field(default_factory=Usage)
    raw_finish_reason: str | None = None
    finish_reason: FinishReason = FinishReason.STOP
    batched: bool = False  # answered through the provider's batch API (billed at its batch price)


class EventType(StrEnum):
    TURN_START = "turn-start"
    STEP_START = "step-start"
    TEXT_DELTA = "text-delta"
    REASONING_DELTA = "reasoning-delta"
    OBJECT_DELTA = "object-delta"
    TOOL_INPUT_DELTA = "tool-input-delta"  # a piece of a tool call's argument JSON, before its tool-call event
    TOOL_CALL = "tool-call"
    TOOL_RESULT = "tool-result"
    APPROVAL_REQUEST = "approval-request"
    APPROVAL_DECISION = "approval-decision"
    TOOL_RESULTS_REQUEST = "tool-results-request"
    STEP_RETRY = "step-retry"
    STEP_RESET = "step-reset"
    STEP_BATCHED = "step-batched"
    STEP_FINISH = "step-finish"
    CONTEXT_COMPACTED = "context-compacted"
    PLAN_UPDATE = "plan-update"  # the agent's visible task plan, whole (see stepq.agents.task_plan)
    TURN_FINISH = "turn-finish"
    ERROR = "error"
    QUOTA_EXCEEDED = "quota-exceeded"  # a usage quota is spent: which, its window and when it resets


CONTENT_EVENTS = frozenset(
    {EventType.TEXT_DELTA, EventType.REASONING_DELTA, EventType.OBJECT_DELTA, EventType.TOOL_INPUT_DELTA}
)


class Event(BaseModel):
    turn_id: str
    seq: int
    type: EventType
    step: int
    data: dict[str, Any] = Field(default_factory=dict)
    ts: float


# --------------------------------------------------------------------------- trace and result


class FailedAttempt(BaseModel):
    """A model call that failed after the provider had reported usage (billed, so it counts)."""

    attempt: int
    usage: Usage
    cost: float | None = None  # when STEPQ_PRICES has the model
    error: str = ""  # the error's status or code (never its text)
    provider: str | None = None  # who failed (after a failover, not the provider the step's trace names)
    model: str | None = None


class AttemptTrace(BaseModel):
    """One model call of a step (every attempt, failed or not): when, on what, how it ended. The step's
    `chat` spans are built from these (engine/otel_spans.py), so `stepq show --trace` and the spans agree."""

    attempt: int
    provider: str
    model: str
    started_at: float  # wall clock (the span's start)
    duration_s: float = 0.0
    outcome: Literal["ok", "retry", "failover", "error"] = "ok"
    error: str | None = None  # the error's status or code, never its text (the span's `error.type`)
    usage: Usage | None = None
    finish_reason: str | None = None
    replayed: bool = False  # the answer came from the step's checkpoint (a re-run after a crash)


class ToolCallTrace(BaseModel):
    """One tool call of a step: how big its arguments and result were (JSON characters) and how it ended."""

    id: str
    name: str
    input_chars: int
    output_chars: int | None = None  # None: never run (the turn ended first)
    status: ToolResultStatus | None = None  # `invalid_arguments` marks arguments that failed the schema
    truncated: bool = False  # the result was cut to STEPQ_MAX_TOOL_RESULT_CHARS before the model read it
    started_at: float | None = None  # wall clock; None: not run by this step's deliveries (a stored result)
    duration_s: float | None = None  # how long the function ran


# A stop condition's registered name (`billing.paid`); stepq.agents.stops registers predicates under it.
STOP_NAME = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*$")


class StopWhen(BaseModel):
    """One stop condition: after `step_count` steps, after a step that called `has_tool_call`, or when the
    registered predicate `custom` (see `stop_condition`) answers True after a tool step."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    step_count: int | None = Field(default=None, ge=1)
    """End the turn (finish reason `step-count`) once this many steps have run their tools."""
    has_tool_call: str | None = None
    """End the turn (finish reason `has-tool-call`) after the step in which the model called this tool
    (e.g. `hand_over`), once it ran."""
    custom: str | None = None
    """End the turn (finish reason `custom-stop`) when the stop condition registered under this name
    (`@stop_condition("billing.paid")`) answers True after a tool step. JSON, so callers may send it too."""

    @model_validator(mode="after")
    def _exactly_one(self) -> StopWhen:
        given = [v for v in (self.step_count, self.has_tool_call, self.custom) if v is not None]
        if len(given) != 1:
            raise ValueError("a stop condition sets exactly one of step_count, has_tool_call or custom")
        if self.custom is not None and not STOP_NAME.match(self.custom):
            raise ValueError(
                f"custom stop condition {self.custom!r} must be dotted lowercase words, e.g. 'billing.paid'"
            )
        return self


class Budget(BaseModel):
    """Spending caps for one turn; crossing one ends the turn with finish reason `budget`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    max_tool_calls: int | None = Field(default=None, ge=0)
    """Most tool calls over the whole turn; a step that would exceed it ends the turn instead."""
    max_wall_clock_s: float | None = Field(default=None, gt=0)
    """Seconds since the turn's first step started, checked before each step (approval waits count)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most input plus output tokens over the whole turn, checked after each step."""
    answer_reserve_tokens: int | None = Field(default=None, ge=0)
    """Object mode: tokens of `max_tokens` held back for the reserved answer step. Tool steps stop once
    the turn's tokens plus this reserve reach `max_tokens`; unset, the reserve is the last step's tokens
    (the answer step reads the same transcript plus the last tool results)."""


# Budgets by name (`Budget` fields), usable wherever a budget is: an agent's `loop.budget`, a submit's
# `loop={"budget": "small"}`, a policy's `budget`. STEPQ_BUDGET_PRESETS replaces or adds names.
DEFAULT_BUDGET_PRESETS: dict[str, Budget] = {
    "small": Budget(max_tool_calls=5, max_wall_clock_s=60.0, max_tokens=20_000),
    "standard": Budget(max_tool_calls=25, max_wall_clock_s=300.0, max_tokens=100_000),
    "long": Budget(max_tool_calls=100, max_wall_clock_s=1800.0, max_tokens=500_000),
}
PRESET_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


class UnknownPresetError(StepqError, ValueError):
    """A budget preset name the process's STEPQ_BUDGET_PRESETS (and the defaults) do not define."""


def budget_preset(name: str, presets: Mapping[str, Budget]) -> Budget:
    """The budget a preset names; UnknownPresetError listing the names this process knows."""
    found = presets.get(name)
    if found is None:
        known = ", ".join(sorted(presets)) or "none"
        raise UnknownPresetError(f"unknown budget preset {name!r}; known: {known} (STEPQ_BUDGET_PRESETS)")
    return found.model_copy()


class Quota(BaseModel):
    """Usage allowed over a window: tokens (input plus output) and/or cost, as `stepq show --trace` counts them.
    Windows are fixed, aligned to the epoch (a day-long window resets at 00:00 UTC)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    tokens: int | None = Field(default=None, ge=1)
    """Most input plus output tokens per window."""
    cost: float | None = Field(default=None, gt=0)
    """Most cost per window, in STEPQ_PRICES' currency (only steps of priced models count)."""
    window_s: float = Field(default=86400.0, ge=1)
    """The window's length in seconds (default a day)."""

    @model_validator(mode="after")
    def _some_limit(self) -> Quota:
        if self.tokens is None and self.cost is None:
            raise ValueError("a quota sets tokens, cost or both")
        return self


MutationPolicy = Literal["read-only", "confirm-required", "destructive-confirm-required"]
KillSwitch = Literal["off", "collapse", "refuse"]


class Policy(BaseModel):
    """What a caller, a tenant or the environment imposes on an agent. Every field only tightens what the
    layers below it allow (see `stepq.policy.resolution`); unset fields leave them as they are."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    max_steps: int | None = Field(default=None, ge=1)
    """Most model calls in one turn."""
    max_tool_calls: int | None = Field(default=None, ge=0)
    """Most tool calls over a turn."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most input plus output tokens over a turn."""
    max_wall_clock_s: float | None = Field(default=None, gt=0)
    """Seconds since the turn's first step started."""
    allowed_tools: list[str] | None = None
    """The tools an agent may still show (those it allowlists and this list names); the task-plan tool stays."""
    mutation_policy: MutationPolicy | None = None
    """Downgrade only: confirm-required < destructive-confirm-required < read-only (a looser value does nothing)."""
    models: list[str] | None = None
    """Allowed `provider/model` patterns (`anthropic/*`, `bedrock`, `*`): a turn on another model is refused."""
    allow_runtime_override: bool | None = None
    """False refuses per-call provider/model choice and loop overrides (True cannot undo an agent's False)."""
    kill_switch: KillSwitch | None = None
    """`collapse`: one model call with no tools, then the turn ends; `refuse`: no new submits or steps."""
    stop_when: list[StopWhen] | None = None
    """Extra stop conditions for the agent's turns (added to its own: a stop can only end a turn sooner)."""
    tool_choice: str | None = None
    """Tighten every step's tool choice: auto < required < a tool's name; auto < none. A layer's choice that
    neither side contains (`none` over an agent's `required`) wins: the higher layer binds."""
    budget: str | None = Field(default=None, pattern=PRESET_NAME.pattern)
    """A budget preset's name (`small`, `standard`, `long`, STEPQ_BUDGET_PRESETS): its caps apply where this
    policy sets none of its own."""
    prompt_sections: dict[str, str] | None = None
    """Set the text of the agent's named prompt sections (`{"tone": "Answer in French."}`); only sections the
    agent declares (its `prompt_sections`), a higher layer's text winning for the same name."""
    default_model: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]*/.+$")
    """`provider/model` this layer's turns run on when the request names none: within the agent's allowed models
    (the layers' `models` allowlists, or else the agent's default model and fallbacks), refused otherwise."""
    quota: Quota | None = None
    """A tenant's usage over a window (in a tenant policy: per tenant at scope `*`, per module or agent at those
    scopes), checked before every model call: spent, the turn stops with `quota-exceeded` (docs/operate/tenants.md)."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Cap on one model call's output tokens: neither the agent nor its `prepare_step` goes above it."""


# A policy document's scopes: the syntax is the document's, so settings (STEPQ_POLICY), the CLI and the
# resolution chain (`stepq.policy.resolution`, which matches scopes to agents) all check it here.
SCOPE_ALL = "*"
_SCOPE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?")


def check_scope(scope: str) -> str:
    """A scope is `*`, a module or an agent id (lowercase, underscores): ValueError naming the problem."""
    if scope == SCOPE_ALL or _SCOPE.fullmatch(scope):
        return scope
    raise ValueError(f"policy scope {scope!r} must be '*', a module ('support') or an agent id ('support.refunds')")


class PolicySource(BaseModel):
    """One effective value of a step and the layer that set it (`request`, `caller`, `tenant`, `environment`,
    `agent` or `default`)."""

    value: Any = None
    layer: str


class StepTrace(BaseModel):
    step: int
    provider: str
    model: str
    tool_calls: list[str] = Field(default_factory=list)
    calls: list[ToolCallTrace] = Field(default_factory=list)  # each call's sizes and outcome
    usage: Usage = Field(default_factory=Usage)  # the successful attempt's tokens
    cost: float | None = None  # this step's cost, failed attempts included (when STEPQ_PRICES has the model)
    failed_attempts: list[FailedAttempt] = Field(default_factory=list)  # those that reported usage
    retries: int = 0
    duration_s: float = 0.0
    stop_reason: str | None = None  # the model call's finish reason (`tool-calls`, `stop`, `length`, ...)
    raw_stop_reason: str | None = None
    tools: list[str] | None = None  # the tools the step showed the model (its active tools)
    tool_choice: str | None = None  # the tool choice it sent (None: the provider's default)
    max_output_tokens: int | None = None  # its output cap, when one was set
    warnings: list[str] = Field(default_factory=list)  # prepare_step asks that were ignored, and why
    stopped_by: LoopStop | None = None  # set on the step after which a loop limit ended the tool steps
    stop_detail: str | None = None  # what that limit named (the custom condition, the tool, the step count)
    kind: Literal["model", "compaction"] = "model"  # compaction: the call that summarised older turns
    malformed: bool = False  # the model's tool call was malformed: the next step got a corrective note
    invalid_output: bool = False  # object mode: this answer failed validation (a repair step or a failure follows)
    repair: bool = False  # object mode: this step answered a repair note
    batch: bool = False  # answered through the provider's batch API
    policy: dict[str, PolicySource] = Field(default_factory=dict)  # each effective limit and who set it
    attempts: list[AttemptTrace] = Field(default_factory=list)  # every model call of the step, in order
    started_at: float | None = None  # wall clock of the step's first delivery (its span's start)
    rerun: bool = False  # a delivery of this step ran again after a worker stopped mid-step
    parked_at: float | None = None  # when it parked for approvals or client-side results ...
    parked_for: Literal["approval", "tool results"] | None = None
    resumed_at: float | None = None  # ... and when it resumed (the wait's span)
    repaired_calls: list[str] = Field(default_factory=list)  # ids of the calls the agent's repair_tool_call fixed
    fingerprint: str | None = None  # the agent definition's fingerprint this step ran with (AgentVersion)
    agent_version: str | None = None  # and its human `version`, when the agent declares one


class LoopTrace(BaseModel):
    steps: list[StepTrace] = Field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The whole loop in one small dict (the `turn-finish` event carries it): totals, then a row per step."""
        steps = self.steps
        return {
            "steps": len(steps),
            "tool_calls": sum(len(s.tool_calls) for s in steps),
            "models": list(dict.fromkeys(f"{s.provider}/{s.model}" for s in steps)),
            "retries": sum(s.retries for s in steps),
            "failed_attempts": sum(len(s.failed_attempts) for s in steps),
            "malformed": sum(s.malformed for s in steps),
            "repairs": sum(s.repair for s in steps),
            "warnings": sum(len(s.warnings) for s in steps),
            "duration_s": round(sum(s.duration_s for s in steps), 4),
            "per_step": [
                {
                    "step": s.step,
                    "model": f"{s.provider}/{s.model}",
                    "tools": s.tool_calls,
                    "tool_input_chars": sum(c.input_chars for c in s.calls),
                    "tool_output_chars": sum(c.output_chars or 0 for c in s.calls),
                    "tokens": s.usage.total_tokens,
                    "cost": s.cost,
                    "stop_reason": s.stop_reason,
                    "stopped_by": s.stopped_by.value if s.stopped_by else None,
                    "stop_detail": s.stop_detail,
                    "policy": {axis: source.layer for axis, source in s.policy.items()},
                }
                for s in steps
            ],
        }


class TurnResult(BaseModel):
    turn_id: str
    agent: str
    status: TurnStatus
    text: str = ""
    object: Any = None
    finish_reason: FinishReason | None = None
    stopped_by: LoopStop | None = None  # the loop limit that ended the turn, if one did
    stop_detail: str | None = None  # what that limit named: the custom condition, the tool, the step count
    usage: Usage = Field(default_factory=Usage)  # failed attempts' reported tokens included
    cost: float | None = None  # when STEPQ_PRICES has the turn's models
    error: str | None = None
    trace: LoopTrace = Field(default_factory=LoopTrace)
    # the whole transcript, tool cycles and reasoning included, every call answered: what submit(messages=) takes
    messages: list[Message] = Field(default_factory=list)
    plan: list[PlanStep] | None = None  # the agent's visible task plan, as last updated


# --------------------------------------------------------------------------- persisted turn state


class LoopLimits(BaseModel):
    """The effective loop configuration for one turn (agent definition tightened by overrides)."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = 10
    stop_after_steps: int | None = None
    stop_on_tool: list[str] = Field(default_factory=list)
    stop_custom: list[str] = Field(default_factory=list)  # names of registered stop conditions (stepq.agents.stops)
    max_tool_calls: int | None = None
    max_wall_clock_s: float | None = None
    max_tokens: int | None = None
    answer_reserve_tokens: int | None = None  # object mode's hold-back for the answer step (see Budget)
    active_tools: list[str] | None = None  # the caller's narrowing of the tools shown on every step
    tool_choice: str | None = None  # the caller's tool choice (as tight as the agent's or tighter)


RATE_WINDOW_S = 60.0
RATE_MARGIN_S = 1.0  # covers grant-to-provider delays that vary by up to a second (a busy worker, a slow network)


class RateLimit(BaseModel):
    """Limits for one provider/model. 0 or None means unlimited.

    Data that agents (`rate_limit=`) and settings (`STEPQ_RATE_LIMITS`) both hold, so it lives here, below
    both; `stepq.fleet.ratelimit` enforces it (and re-exports it under its documented path)."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(default=None, ge=0)
    tpm: int | None = Field(default=None, ge=0)
    concurrency: int | None = Field(default=None, ge=0)
    window_s: float = Field(default=RATE_WINDOW_S, gt=0)  # rpm/tpm count over this sliding window
    # each request and token charge counts for window_s + margin_s: the slack for the varying delay between
    # a grant and the request reaching the provider, which counts at its side
    margin_s: float = Field(default=RATE_MARGIN_S, ge=0)
    penalty_factor: float = Field(default=0.5, gt=0, le=1)
    penalty_s: float = Field(default=60.0, ge=0)

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm or self.concurrency)

    @property
    def counting_window_s(self) -> float:
        """How long a grant counts against rpm/tpm: grants of `rpm` requests are at least this far apart."""
        return self.window_s + self.margin_s


class Fallback(BaseModel):
    """A provider/model a step moves to when its attempts on the current one are exhausted before any
    content streamed. Written `{"provider": ..., "model": ...}` or as the `provider/model` shorthand."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            provider, sep, model = value.partition("/")
            if not sep:
                raise ValueError(f"fallback {value!r}: write it as provider/model or {{provider, model}}")
            return {"provider": provider, "model": model}
        return value


class StepPlan(BaseModel):
    """What one step runs with, resolved once per step (agent, prepare_step, caller) and kept until the next
    step, so a retried or resumed step uses the same plan. `base` is the turn's own provider/model while a
    step runs on another one (prepare_step's `model`): the next step starts from it again."""

    step: int
    tools: list[str]
    tool_choice: str | None = None
    max_output_tokens: int | None = None
    system: str | None = None  # prepare_step's extra system text
    base: Fallback | None = None
    warnings: list[str] = Field(default_factory=list)
    temperature: float | None = None  # sampling (the agent's, or prepare_step's for this step)
    top_p: float | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None


class PendingApproval(BaseModel):
    """A gated call waiting for a person: what a reviewer needs to decide it (never its token)."""

    approval_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, Any] | None = None  # the validated arguments, as the approval request shows them
    expires_at: float


class PendingToolCall(BaseModel):
    """A call of a client-side tool (declared without a server implementation): its caller supplies the
    result with `Client.resume` before `expires_at`, or the model reads that none came."""

    tool_call_id: str
    tool_name: str
    args: dict[str, Any] = Field(default_factory=dict)
    expires_at: float


class Compaction(BaseModel):
    """How the transcript the model sees differs from the turn's own (which stays whole, for the record):
    `messages[:summarised]` are replaced by one user message holding `summary`, and the results of the
    tool-result messages at the positions in `cut` are cut to `cut_chars`. Stored with the turn, so a redelivered step sees the same."""

    summarised: int = 0
    summary: str | None = None
    cut: list[int] = Field(default_factory=list)  # positions (in the turn's transcript) of tool results cut
    cut_chars: int = 0


UpgradePolicy = Literal["pin", "fail", "continue"]


class AgentVersion(BaseModel):
    """What a running turn depends on in its agent's definition, hashed part by part (stepq.agents.fingerprint):
    kept with the turn so the next step, maybe on newer code, can tell what changed (stepq.agents.compatibility)."""

    fingerprint: str  # sha256 of every part below but `version` and `on_incompatible`
    version: str | None = None  # the agent's human version string
    prompt_version: str | None = None
    tools: dict[str, str] = Field(default_factory=dict)  # tool name -> hash of its argument schema
    output: str | None = None  # hash of the object-mode output schema
    execution_mode: str = "chat"
    mutation_policy: str = "confirm-required"
    on_incompatible: UpgradePolicy = "pin"  # kept so a worker without the agent still knows what to do

    @property
    def short(self) -> str:
        """The first 12 hex digits: what queue names, `stepq status` and traces show."""
        return self.fingerprint[:12]


class Pin(BaseModel):
    """A turn held on an older definition: its steps go to `queue`, served by workers that still load it."""

    fingerprint: str
    queue: str
    reason: str
    through_step: int | None = None  # the last step that needs the old code (None: every step of the turn)
    at: float = Field(default_factory=time.time)


class ParkedStep(BaseModel):
    """A step whose tool calls wait for approvals or for client-side results; holds everything to resume it."""

    assistant: AssistantMessage
    step_usage: Usage
    raw_stop_reason: str | None = None
    finish_reason: FinishReason | None = None
    approvals: list[PendingApproval] = Field(default_factory=list)
    client_calls: list[PendingToolCall] = Field(default_factory=list)
    step_trace: StepTrace

    @property
    def expires_at(self) -> float:
        """When the first thing it waits for expires (the sweeper resumes the step then)."""
        return min([a.expires_at for a in self.approvals] + [c.expires_at for c in self.client_calls])


class TurnState(BaseModel):
    # how many messages / trace steps are already in Redis: a commit appends only what is new
    _stored_messages: int = PrivateAttr(default=0)
    _stored_trace: int = PrivateAttr(default=0)
    _stored_status: TurnStatus | None = PrivateAttr(default=None)  # as last read or written (sweeper lists)
    _stored_score: float = PrivateAttr(default=0.0)  # its sweeper-list entry's score then (store.turns.index_score)
    # a new turn's files (base64) by attachment id, from submit until they are stored (never in the state JSON)
    _files: dict[str, str] = PrivateAttr(default_factory=dict)
    _objects: dict[str, bytes] = PrivateAttr(default_factory=dict)  # files above the Redis threshold, by s3:// URI
    # whether a stored message carries files, as the store last saw the transcript (None: not known here)
    _stored_files: bool | None = PrivateAttr(default=None)

    turn_id: str
    agent: str
    status: TurnStatus = TurnStatus.QUEUED
    version: int = 0
    step: int = 0
    attempt: int = 0
    provider: str
    model: str
    messages: list[Message] = Field(default_factory=list)  # stored apart, append-only (see store/turns.py)
    limits: LoopLimits  # this step's effective limits (base_limits under the current policies)
    base_limits: LoopLimits | None = None  # the agent's limits tightened by the request, from submit
    sources: dict[str, str] = Field(default_factory=dict)  # the layer of each base limit and of the model
    caller_policy: Policy | None = None  # the caller layer, from submit (see stepq.policy.resolution)
    metadata: dict[str, Any] = Field(default_factory=dict)
    features: list[str] = Field(default_factory=list)  # the caller's, from submit: tools requiring others are hidden
    priority: str = "interactive"
    provider_batch: bool = False  # batch priority: model requests go through the provider's batch API
    batch_online_step: int | None = None  # this step left the provider batch (deadline, failures): runs online
    batch_deadline_at: float | None = None  # a parked batch request still unanswered then runs online
    idempotency_key: str | None = None
    thread_id: str | None = None  # set for a turn of a thread: its finish folds into the thread
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    updated_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    not_before: float | None = None  # a scheduled retry: the sweeper leaves the turn alone until then
    usage: Usage = Field(default_factory=Usage)
    tool_calls_made: int = 0
    failed_tools: dict[str, tuple[int, str]] = Field(default_factory=dict)
    malformed_retry_used: bool = False
    repairs_used: int = 0
    answer_due: LoopStop | None = None  # object mode: a limit fired; the next step is the reserved answer step
    failed_attempts: list[FailedAttempt] = Field(default_factory=list)  # this step's, until its trace is written
    parked: ParkedStep | None = None
    traceparent: str | None = None  # the W3C trace context the turn was submitted under (its spans' parent)
    attempts: list[AttemptTrace] = Field(default_factory=list)  # this step's model calls, until its trace is written
    step_started_at: float | None = None  # this step's first delivery (wall clock), until its trace is written
    step_rerun: bool = False  # this step was delivered again after a worker stopped mid-step
    compaction: Compaction | None = None  # the model sees a compacted transcript (see engine/compaction.py)
    step_plan: StepPlan | None = None  # this step's tools, tool choice, model (see StepPlan)
    trace: LoopTrace = Field(default_factory=LoopTrace)
    text: str = ""
    object: Any = None
    finish_reason: FinishReason | None = None
    stopped_by: LoopStop | None = None
    stop_detail: str | None = None
    cost: float | None = None
    error: str | None = None
    plan: list[PlanStep] | None = None  # the visible task plan (agents with task_plan=True)
    context: dict[str, Any] | None = None  # the runtime context (stepq.agents.runtime_context), as JSON
    call_prepared: bool = False  # the agent's prepare_call ran (stored with the commit that starts the turn)
    instructions: str | None = None  # prepare_call's extra system text for every step
    defer_tools: bool = False  # submit's defer_tools=True: every tool call parks for the caller (engine/deferred.py)
    agent_version: AgentVersion | None = None  # the definition the last step ran with (set at the first step)
    started_fingerprint: str | None = None  # the definition's fingerprint at the turn's first step
    pin: Pin | None = None  # held on an older definition after an incompatible deploy (see engine/upgrade.py)

    @property
    def running_fingerprint(self) -> str | None:
        """The short fingerprint of the definition this step runs under (a step trace's `fingerprint`)."""
        return self.agent_version.short if self.agent_version else None

    @property
    def running_version(self) -> str | None:
        """...and its human version string (a step trace's `agent_version`)."""
        return self.agent_version.version if self.agent_version else None

    def carries_files(self) -> bool:
        """Whether a message of the transcript carries files. A state the store read or wrote knows it without
        a scan (a step runs this check once, and a long turn's transcript would make it O(turn length)); the
        messages a step adds never carry files. Any other state is scanned."""
        known = self._stored_files
        return carry_files(self.messages) if known is None else known

    def result(self) -> TurnResult:
        return TurnResult(
            turn_id=self.turn_id,
            agent=self.agent,
            status=self.status,
            text=self.text,
            object=self.object,
            finish_reason=self.finish_reason,
            stopped_by=self.stopped_by,
            stop_detail=self.stop_detail,
            usage=self.usage,
            cost=self.cost,
            error=self.error,
            trace=self.trace,
            messages=closed_transcript(self.messages),
            plan=self.plan,
        )


def new_turn_id(home: str | None = None) -> str:
    """A fresh turn id: random, so ids never collide across producers and never reveal a count. Its first 8 hex
    are its home (its Redis Cluster hash tag, see stepq.store.keys): `home` puts it beside its thread's or its
    idempotency key's keys; otherwise the home is random too."""
    random_hex = uuid.uuid4().hex
    return f"turn_{home}{random_hex[8:]}" if home else f"turn_{random_hex}"


def new_approval_id(home: str) -> str:
    """A fresh approval id in its turn's home, so its record lives in the turn's Redis Cluster slot."""
    return f"apv_{home}{uuid.uuid4().hex[8:]}"
