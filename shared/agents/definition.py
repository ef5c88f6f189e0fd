"""Agent definitions (the registry that loads them from `STEPQ_AGENT_MODULES` is `stepq.agents.registry`).

An agent is a contract: which tools the model may see, what it may change, who may
call it, how long its loop may run, and what shape its answer must have.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from stepq.agents.hooks import HOOK_NAMES, FailsTurn, HookFn
from stepq.agents.mcp import McpTool, check_mcp_names
from stepq.agents.prompt_parts import Suggestion, check_section_names
from stepq.agents.runtime_context import CallContext, CallOverrides
from stepq.agents.step_control import ReasoningEffort, StepContext, StepOverrides, check_choice
from stepq.agents.stops import get_stop_condition, unknown_message
from stepq.agents.strict_schema import strict_problem
from stepq.agents.task_plan import PLAN_GUIDANCE, PLAN_TOOL, plan_tool
from stepq.agents.tools import ToolDefinition, get_tool
from stepq.config.settings import get_settings
from stepq.errors import DefinitionError
from stepq.models import (
    SUPPORTED_TYPES,
    Budget,
    Fallback,
    LoopLimits,
    MutationPolicy,
    RateLimit,
    StopWhen,
    ToolCall,
    ToolSpec,
    UpgradePolicy,
    budget_preset,
)
from stepq.providers.base import OUTPUT_TOOL
from stepq.providers.function import FunctionModel
from stepq.providers.registry import check_tool_schemas, known_providers, split_shorthand
from stepq.providers.scripted import ScriptStep

ExecutionMode = Literal["chat", "object"]
RepairToolCall = Callable[[ToolCall, str], "ToolCall | None"]
_AGENT_ID = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")

# An object-mode agent answers through one extra tool, `OUTPUT_TOOL`. Tool inputs must be objects,
# so any other output schema rides wrapped as {OUTPUT_WRAPPER: ...}.
OUTPUT_WRAPPER = "value"
OUTPUT_TOOL_DESCRIPTION = (
    "Return your final answer by calling this tool exactly once, with arguments that match its schema. "
    "Call it only when you are done using other tools."
)


# Picker metadata: one line each, short enough to show in a list (checked at load, see `check_metadata`).
LABEL_MAX = 80
WORD_MAX = 40
CAPABILITY_MAX = 120


def readable_label(agent_id: str) -> str:
    """A picker label from an id, for agents that set none: `support.refund_desk` -> `Refund desk`."""
    name = agent_id.rpartition(".")[2].replace("_", " ").strip()
    return name[:1].upper() + name[1:]


class LoopConfig(BaseModel):
    """How long an agent's loop may run. A caller's `LoopOverrides` may only tighten it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_steps: int = Field(default=10, ge=1, le=1000)
    """Most model calls in one turn; reaching it ends the turn with finish reason `max-steps`."""
    stop_when: list[StopWhen] = Field(default_factory=list)
    """Extra stop conditions; the first one met ends the turn."""
    budget: Budget = Field(default_factory=Budget)
    """Caps on tool calls, wall-clock time and tokens; or a preset's name (`"small"`, `"standard"`, `"long"`,
    STEPQ_BUDGET_PRESETS), read when the agent is defined."""

    @field_validator("budget", mode="before")
    @classmethod
    def _budget_preset(cls, value: Any) -> Any:
        if isinstance(value, str):
            return budget_preset(value, get_settings().budget_presets)
        return value

    def limits(self) -> LoopLimits:
        step_counts = [s.step_count for s in self.stop_when if s.step_count is not None]
        return LoopLimits(
            max_steps=self.max_steps,
            stop_after_steps=min(step_counts) if step_counts else None,
            stop_on_tool=[s.has_tool_call for s in self.stop_when if s.has_tool_call],
            stop_custom=[s.custom for s in self.stop_when if s.custom],
            max_tool_calls=self.budget.max_tool_calls,
            max_wall_clock_s=self.budget.max_wall_clock_s,
            max_tokens=self.budget.max_tokens,
            answer_reserve_tokens=self.budget.answer_reserve_tokens,
        )


class AgentDefinition(BaseModel):
    """An agent: a module-level instance in a module listed in STEPQ_AGENT_MODULES is loaded by id.

    It is checked when its module loads (tool names, output schema, what its provider can take),
    so a bad definition fails at start, never inside a running turn.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)

    id: str
    """`<module>.<name>`, lowercase with underscores: what callers submit to."""
    label: str = Field(default_factory=lambda data: readable_label(data.get("id", "")))
    """The agent's name in a picker (`stepq agents`, `GET /v1/agents`); unset, read from the id
    (`support.refund_desk` -> `Refund desk`). The model never sees it, nor the other picker metadata."""
    description: str = ""
    """For people (the CLI, the gateway's agent list); the model never sees it."""
    version: str | None = None
    """A human version string (`"2026.12.1"`, `"v2"`) shown beside the definition's fingerprint in traces and
    `stepq status`; it names a deploy, the fingerprint says what changed (see docs/operate/deploying.md)."""
    prompt_version: str | None = None
    """The prompt's version, when the agent declares one: part of the fingerprint (prompt text is not, so a
    wording change needs no version bump); a changed prompt version is a compatible change."""
    on_incompatible_upgrade: UpgradePolicy = "pin"
    """What a turn's next step does when this definition changed incompatibly for it since its last step (a tool
    it waits on removed or no longer accepting the stored arguments, the object schema changed): `pin` sends the
    step to workers that still load the old definition, `fail` ends the turn naming what changed, `continue`
    runs it on the new one anyway."""
    keywords: list[str] = Field(default_factory=list)
    """Short search words a picker matches (`["refunds", "orders"]`), so a person or a router finds the agent."""
    domain: str | None = None
    """The area the agent works in (`customers`, `billing`), for grouping in a picker and routing by area."""
    data_capabilities: list[str] = Field(default_factory=list)
    """What data the agent can read or change, in words a picker shows (`["orders: read", "refunds: issue"]`)."""
    system_prompt: str = ""
    """The system message of every step (its first paragraph, before `prompt_sections`)."""
    prompt_sections: dict[str, str] = Field(default_factory=dict)
    """Named paragraphs of the system message after `system_prompt`, in this order: the parts another module's
    `AgentExtension` replaces, deletes or appends by name."""
    allowed_tools: list[str] = Field(default_factory=list)
    """Whitelist of tool names (registered with `@tool`) the model may be shown; nothing else is."""
    suggestions: list[Suggestion] = Field(default_factory=list)
    """Starter prompts a chat launcher offers before the first message (`Suggestion(label=..., prompt=...)`; a
    label alone is its prompt too), listed by `stepq agents` and `GET /v1/agents`. The model never sees them."""
    task_plan: bool = False
    """Show the model the read-only `update_task_plan` tool and tell it to state its plan with it: the plan
    streams as `plan-update` events and is stored with the turn (see `stepq.agents.task_plan`). Not listed in
    `allowed_tools`: this flag adds it."""
    mcp_tools: list[McpTool] = Field(default_factory=list)
    """Tools of MCP servers the model may be shown, each pinned to its input schema (`McpTool`); policy applies
    to them exactly as to `allowed_tools`."""
    read_only: bool = True
    """True hides every mutation or destructive tool from the model, whatever `allowed_tools` says."""
    mutation_policy: MutationPolicy = "confirm-required"
    """With writes allowed: `confirm-required` gates every mutation tool on a person's approval,
    `destructive-confirm-required` gates mutation and destructive tools, `read-only` hides writes."""
    required_features: list[str] = Field(default_factory=list)
    """Features a caller must pass at submit (`features=[...]`); a caller without them is refused."""
    execution_mode: ExecutionMode = "chat"
    """`chat` answers with text; `object` answers with one JSON value validated against `output`."""
    output: Any = None
    """Object mode: a pydantic model class or a JSON schema dict the answer must match."""
    output_repairs: int = Field(default=1, ge=0, le=5)
    """Object mode: repair steps allowed after an invalid answer (each names what was wrong)."""
    default_provider: str | None = None
    """Provider when the caller chooses none (`anthropic`, `anthropic-vertex`, `gemini`, `bedrock`,
    `scripted`, `function`, `test`); unset falls back to STEPQ_PROVIDER, or `scripted` when the agent has a
    `script` (`function` when it has a `function_model`)."""
    default_model: str | None = None
    """Model when the caller chooses none (`provider/model` sets both); unset falls back to STEPQ_MODEL."""
    loop: LoopConfig = Field(default_factory=LoopConfig)
    """Step limit, stop conditions and budget."""
    allow_runtime_override: bool = True
    """Whether a submit may choose the provider and model per turn and send loop overrides (`loop=`); False
    refuses both (the caller's, tenant's and environment's policies still apply). A policy may turn it off."""
    fallbacks: list[Fallback] = Field(default_factory=list)
    """Where a step goes, in order, when its attempts are exhausted with retryable errors before any content
    streamed: `[{"provider": "bedrock", "model": "..."}, "anthropic-vertex/claude-..."]`. The turn stays on
    the provider that answered; unset uses STEPQ_FALLBACKS."""
    retry_after_emission: bool = False
    """Retry a failed model call even after it streamed content (subscribers see a `step-reset`);
    by default only failures before the first chunk are retried."""
    tool_failure_breaker: int | None = Field(default=None, ge=1)
    """Failures after which a tool is blocked for the rest of the turn (`permanently_failed`);
    unset uses the provider's preference (on for Gemini and Anthropic on Vertex, off otherwise)."""
    tool_choice: str | None = None
    """Every step's tool choice: `auto` (the model decides), `none` (no tool calls), `required` (at least one
    call) or a tool's name (that tool); each adapter maps it to its API's own. Unset: the provider default."""
    parallel_tool_calls: bool = True
    """False: at most one tool call per step. Anthropic and OpenAI are told so natively
    (`disable_parallel_tool_use`, `parallel_tool_calls: false`); Gemini and Bedrock have no such switch, so
    the engine runs only a step's first call and answers the others "not run: one tool call per step"."""
    active_tools: list[str] | None = None
    """The tools shown on every step, a subset of `allowed_tools` (unset: all the allowlist shows).
    `prepare_step` may change it per step, within the allowlist and the mutation gate; callers narrow it."""
    prepare_step: Callable[[StepContext], StepOverrides | dict[str, Any] | None] | None = Field(
        default=None, exclude=True
    )
    """`fn(StepContext) -> StepOverrides | dict | None`, called on the worker before each step: overrides
    for that step only (`model`, `active_tools`, `tool_choice`, `max_output_tokens`, extra `system` text)."""
    on_step_start: HookFn | None = Field(default=None, exclude=True)
    """`fn(StepStarted)`, on the worker before a step calls the model (again on a re-run, marked `rerun`)."""
    on_model_request: HookFn | None = Field(default=None, exclude=True)
    """`fn(ModelRequested)`: sees each attempt's final request (after prepare_step and the policies); a copy."""
    on_tool_result: HookFn | None = Field(default=None, exclude=True)
    """`fn(ToolResulted)`, after the step's commit: once per tool call of a committed step, with its duration."""
    on_step_finish: HookFn | None = Field(default=None, exclude=True)
    """`fn(StepFinished)`, after the step's fenced commit: once per committed step (never for a fenced-off re-run)."""
    on_turn_finish: HookFn | None = Field(default=None, exclude=True)
    """`fn(TurnResult) -> str | None`, after the turn's end committed; a returned string is the thread's next
    prompt (a turn of a thread: it continues the thread, queued after it). Hooks: sync or `async def`; one that
    raises is logged and counted, and fails the turn only when wrapped in `fails_turn` (stepq.agents.hooks)."""
    max_output_tokens: int | None = None
    """Cap on one model call's output tokens (provider default when unset)."""
    temperature: float | None = None
    """Sampling temperature (provider default when unset)."""
    stop_sequences: list[str] = Field(default_factory=list)
    """Strings that end a model call's output."""
    approval_ttl_s: float | None = None
    """How long this agent's approvals stay open before they resolve as a denial (default STEPQ_APPROVAL_TTL_S)."""
    provider_options: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific options, e.g. `{"thinking_budget": 2048}` (see docs/providers/)."""
    rate_limit: RateLimit | None = None
    """Fleet-wide limit for this agent's provider/model; overrides STEPQ_RATE_LIMITS."""
    priority: Literal["interactive", "batch"] = "interactive"
    """`batch` sends this agent's turns to the batch queue, which workers drain after interactive turns."""
    accepted_media_types: list[str] = Field(default_factory=list)
    """Files callers may attach (`image/png`, `image/*`, `application/pdf`, `text/plain`...); none by default."""
    script: list[ScriptStep] | None = None
    """The offline `scripted` provider's steps: step N of a turn plays `script[N]` (the last repeats)."""
    function_model: FunctionModel | None = None
    """The offline `function` provider's model: `FunctionModel(fn)` (answers computed from each request)
    or `TestModel()`; the default provider when set and no `script` is."""
    strict_tools: bool = False
    """Send every tool's schema as a provider-native strict schema (OpenAI, Anthropic: the model's arguments are
    constrained to it); a tool's own `@tool(strict=...)` wins. Checked strict-compatible at load. Gemini and
    Bedrock have no strict mode: their arguments are validated against the schema before the tool runs."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass of every step (provider default when unset); `prepare_step` may set it per step."""
    reasoning_effort: ReasoningEffort | None = None
    """`minimal`, `low`, `medium` or `high`: OpenAI's `reasoning_effort`, Gemini's thinking level. Per step too."""
    thinking_budget: int | None = Field(default=None, ge=0)
    """Thinking tokens per step: Anthropic's (and Claude on Bedrock's) `budget_tokens`, Gemini's
    `thinkingBudget` (see docs/guides/agent-contract.md). Wins over `provider_options["thinking_budget"]`."""
    fall_through_unconfigured: bool = False
    """When this deployment has not configured `default_provider` (no credential, no SDK), run the turn on the
    first configured provider of `fallbacks` (in order; STEPQ_FALLBACKS when unset) instead of refusing it."""
    repair_tool_call: RepairToolCall | None = Field(default=None, exclude=True)
    """`fn(call, error) -> ToolCall | None`, run on the worker once per malformed call (arguments not JSON, an
    unknown tool, arguments the schema refuses): the call it returns replaces the model's (traced, stored and
    gated like any); None keeps the call as sent (then the corrective retry, or the error the model reads)."""

    context_schema: type[BaseModel] | None = Field(default=None, exclude=True)
    """A pydantic model for the runtime context a submit passes (`context=`): validated at submit (one line
    naming the field), stored with the turn, given to tools as `ctx.context` and to `prepare_step` (which may
    return an updated one for the later steps). See `stepq.agents.runtime_context`."""
    prepare_call: Callable[[CallContext], CallOverrides | dict[str, Any] | None] | None = Field(
        default=None, exclude=True
    )
    """`fn(CallContext) -> CallOverrides | dict | None`, called on the worker once per turn before its first step
    (never again, redeliveries included): the turn's `model`, extra `instructions` and `context`."""

    _tool_modules: dict[str, str] = PrivateAttr(default_factory=dict)  # tool name -> the module declaring it
    _version: Any = PrivateAttr(default=None)  # (id(self), its AgentVersion) once computed (stepq.agents.fingerprint)

    @property
    def has_hooks(self) -> bool:
        """Any lifecycle hook set (the engine builds the hooks' arguments only then)."""
        return any(getattr(self, name) is not None for name in HOOK_NAMES)

    @field_validator("accepted_media_types")
    @classmethod
    def _check_media_types(cls, value: list[str]) -> list[str]:
        families = {t.split("/")[0] + "/*" for t in SUPPORTED_TYPES}
        for media_type in value:
            if media_type.lower() not in SUPPORTED_TYPES | families:
                raise ValueError(
                    f"accepted_media_types: {media_type!r} is not a type stepq carries; use any of "
                    f"{', '.join(sorted(SUPPORTED_TYPES | families))}"
                )
        return [t.lower() for t in value]

    @field_validator("fallbacks")
    @classmethod
    def _check_fallbacks(cls, value: list[Fallback]) -> list[Fallback]:
        unknown = [f.provider for f in value if f.provider not in known_providers()]
        if unknown:
            raise ValueError(f"fallbacks name unknown providers {unknown}; known: {', '.join(known_providers())}")
        return value

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _AGENT_ID.match(value):
            raise ValueError(f"agent id {value!r} must look like '<module>.<name>' (lowercase, underscores)")
        return value

    @field_validator("prompt_sections")
    @classmethod
    def _check_section_names(cls, value: dict[str, str]) -> dict[str, str]:
        check_section_names(value, "prompt_sections")
        return value

    @field_validator("allowed_tools")
    @classmethod
    def _check_plan_tool(cls, value: list[str]) -> list[str]:
        if PLAN_TOOL in value:
            raise ValueError(f"allowed_tools: {PLAN_TOOL!r} is added by task_plan=True; remove it from the list")
        return value

    @model_validator(mode="after")
    def _check_output(self) -> AgentDefinition:
        if self.execution_mode == "object":
            if self.output is None:
                raise ValueError("execution_mode='object' needs an `output` schema (pydantic model or JSON schema)")
            if isinstance(self.output, dict):
                try:
                    jsonschema.Draft202012Validator.check_schema(self.output)
                except jsonschema.SchemaError as exc:
                    raise ValueError(f"output JSON schema is invalid: {exc.message}") from None
            elif not (isinstance(self.output, type) and issubclass(self.output, BaseModel)):
                raise ValueError("output must be a pydantic model class or a JSON schema dict")
        return self

    @model_validator(mode="after")
    def _check_hooks(self) -> AgentDefinition:
        for name in ("on_tool_result", "on_step_finish", "on_turn_finish"):
            if isinstance(getattr(self, name), FailsTurn):
                raise ValueError(
                    f"{name} runs after the step's commit, so it cannot fail the turn: fails_turn() applies to "
                    "on_step_start and on_model_request"
                )
        return self

    @property
    def module(self) -> str:
        return self.id.split(".", 1)[0]

    def output_schema(self) -> dict[str, Any] | None:
        if self.output is None:
            return None
        if isinstance(self.output, dict):
            return self.output
        return copy.deepcopy(_model_schema(self.output))  # a copy: callers may edit theirs

    def output_tool(self) -> ToolSpec:
        """The tool an object-mode step answers through, declared to the model beside the agent's own."""
        schema = dict(self.output_schema() or {})
        if schema.get("type") == "object":
            schema.pop("title", None)
        else:
            schema = {"type": "object", "properties": {OUTPUT_WRAPPER: schema}, "required": [OUTPUT_WRAPPER]}
        return ToolSpec(name=OUTPUT_TOOL, description=OUTPUT_TOOL_DESCRIPTION, input_schema=schema)

    def bind_tools(self, modules: Mapping[str, str]) -> None:
        """Pin each tool name to the module whose declaration this agent runs (the registry does, at load), so
        another module's tool of the same name never stands in for it."""
        self._tool_modules = dict(modules)
        self._version = None  # its tools may have changed: the fingerprint is computed again

    def tool(self, name: str) -> ToolDefinition | None:
        """The tool this agent runs under `name` (an override's, if a module replaced it; None: unknown,
        disabled, or declared by several modules and not bound to one)."""
        return get_tool(name, self._tool_modules.get(name))

    def visible_tools(self, features: Collection[str] | None = None) -> list[ToolDefinition]:
        """The tools the model is shown: the whitelist and the MCP tools, minus writes unless writes are unlocked,
        minus the tools whose `required_features` the caller lacks (`features=None`: any caller)."""
        tools = [t for t in map(self.tool, self.allowed_tools) if t is not None]
        tools += [t.definition() for t in self.mcp_tools]
        tools = [t for t in tools if t.available_to(features)]
        if not self.writes_allowed:
            tools = [t for t in tools if not (t.is_mutation or t.destructive)]
        if self.task_plan:
            tools.append(plan_tool())
        return tools

    @property
    def instructions(self) -> str | None:
        """The system text of every step: the agent's prompt and its sections, then the plan guidance when it has a
        plan; paragraphs apart."""
        plan = PLAN_GUIDANCE if self.task_plan else ""
        parts = [p for p in (self.system_prompt, *self.prompt_sections.values(), plan) if p]
        return "\n\n".join(parts) or None

    @property
    def writes_allowed(self) -> bool:
        return not self.read_only and self.mutation_policy != "read-only"

    def tool_spec(self, definition: ToolDefinition) -> ToolSpec:
        """The tool as the model is shown it: strict when the tool says so, else when the agent does."""
        strict = self.strict_tools if definition.strict is None else definition.strict
        return ToolSpec(
            name=definition.name,
            description=definition.description,
            input_schema=definition.input_schema,
            strict=strict,
        )

    def call_needs_approval(self, definition: ToolDefinition, args: dict[str, Any]) -> bool:
        if definition.requires_approval(args):
            return True
        if self.mutation_policy == "confirm-required":
            return definition.is_mutation
        if self.mutation_policy == "destructive-confirm-required":
            return definition.is_mutation or definition.destructive
        return False


def check_step_tools(agent: AgentDefinition) -> None:
    """`active_tools` and `tool_choice` must name tools the agent can show: refused at load, not mid-turn."""
    shown = [t.name for t in agent.visible_tools()]
    for name in agent.active_tools or []:
        if name not in agent.allowed_tools:
            raise DefinitionError(f"agent {agent.id}: active_tools names {name!r}, which allowed_tools does not list")
        if name not in shown:
            raise DefinitionError(
                f"agent {agent.id}: active_tools names {name!r}, a write tool the agent hides (read_only=True or "
                "mutation_policy='read-only')"
            )
    if agent.tool_choice is not None:
        active = shown if agent.active_tools is None else [n for n in shown if n in agent.active_tools]
        problem = check_choice(agent.tool_choice, active)
        if problem:
            raise DefinitionError(f"agent {agent.id}: {problem}")


def check_strict_tools(agent: AgentDefinition) -> None:
    """A strict tool's schema must be one a strict mode takes (stepq.agents.strict_schema): refused at load."""
    for spec in map(agent.tool_spec, agent.visible_tools()):
        problem = strict_problem(spec.input_schema) if spec.strict else None
        if problem:
            raise DefinitionError(f"agent {agent.id}: tool {spec.name!r}: {problem}")


def _one_line_problem(text: str, limit: int) -> str | None:
    if not text.strip():
        return "is empty"
    if "\n" in text or "\r" in text:
        return "must be one line"
    if len(text) > limit:
        return f"is {len(text)} characters; at most {limit}"
    return None


def check_metadata(agent: AgentDefinition) -> None:
    """The picker metadata must show as one short line each, and a list must not repeat itself: a label a
    picker truncates or a keyword listed twice is a definition mistake, refused at load, not shown."""
    fields: list[tuple[str, list[str], int]] = [
        ("label", [agent.label], LABEL_MAX),
        ("domain", [agent.domain] if agent.domain is not None else [], WORD_MAX),
        ("keywords", agent.keywords, WORD_MAX),
        ("data_capabilities", agent.data_capabilities, CAPABILITY_MAX),
    ]
    for name, values, limit in fields:
        for value in values:
            problem = _one_line_problem(value, limit)
            if problem:
                shown = f" {value[:limit]!r}" if value.strip() else ""
                raise DefinitionError(f"agent {agent.id}: {name}{shown} {problem}")
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise DefinitionError(f"agent {agent.id}: {name} lists {', '.join(map(repr, repeated))} more than once")


def check_agent(agent: AgentDefinition) -> None:
    """What loading refuses: unknown tools and stop conditions, tool names that clash, schemas a provider cannot take,
    picker metadata that cannot show as one line."""
    check_metadata(agent)
    unknown = [name for name in agent.allowed_tools if agent.tool(name) is None]
    if unknown:
        raise DefinitionError(f"agent {agent.id}: allowed_tools names unknown tools: {', '.join(unknown)}")
    check_step_tools(agent)
    for stop in agent.loop.stop_when:
        if stop.custom is not None and get_stop_condition(stop.custom) is None:
            raise DefinitionError(f"agent {agent.id}: loop.stop_when: {unknown_message(stop.custom)}")
    check_mcp_names(agent.id, agent.allowed_tools, agent.mcp_tools)
    check_strict_tools(agent)
    provider, _ = split_shorthand(agent.default_provider, agent.default_model)
    providers = [p for p in (provider, *(f.provider for f in agent.fallbacks)) if p]
    if providers:
        specs = [agent.tool_spec(t) for t in agent.visible_tools()]
        if agent.execution_mode == "object":
            specs.append(agent.output_tool())
        for name in dict.fromkeys(providers):  # the fallbacks must take the tools too
            check_tool_schemas(name, specs)


@functools.lru_cache(maxsize=256)
def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema, built once: pydantic rebuilds it on every call, and every step of an
    object-mode turn asks for it several times (about a millisecond each, a large part of a batch step)."""
    schema: dict[str, Any] = model.model_json_schema()
    return schema
