"""Tool definitions: a JSON schema the model sees, validation before execution, and the call context.

A tool is declared with `@tool` on a function whose type hints (or a pydantic
model) give the input schema. Arguments from the model are validated before the
function runs; validation failures become tool errors the model can read.
"""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, get_type_hints

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from stepq.agents.tool_process import run_process
from stepq.cancel import CancelSignal
from stepq.errors import DefinitionError, ToolArgumentError

ApprovalPredicate = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about the call. `idempotency_key` is stable across re-runs.

    `cancelled` is set when the call's timeout was reported to the model, and when the turn is cancelled
    while the tool runs (seen within `STEPQ_CANCEL_POLL_S`). Python cannot stop a running function, so a
    long tool checks it (`ctx.cancelled.is_set()`, or waits on it instead of sleeping) before it changes
    anything; whatever it returns after a timeout is discarded and logged. An `async def` tool's task is
    cancelled outright, and a process started with `run_process` is killed."""

    turn_id: str
    tool_call_id: str
    idempotency_key: str
    metadata: Mapping[str, Any]
    logger: logging.Logger
    cancelled: CancelSignal = field(default_factory=CancelSignal)
    context: Any = None  # the turn's runtime context: an instance of the agent's context_schema (None: none)

    def run_process(
        self,
        args: Sequence[str],
        *,
        input: str | None = None,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a subprocess (text output captured) that is killed, with its children, when this call is
        cancelled; the tool then gets a ToolCancelledError. Use it instead of `subprocess.run` in tools."""
        return run_process(self.cancelled, args, input=input, timeout_s=timeout_s, cwd=cwd, env=env, check=check)


@dataclass
class ToolDefinition:
    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any]
    args_model: type[BaseModel] | None = None
    is_mutation: bool = False
    destructive: bool = False
    needs_approval: bool | ApprovalPredicate = False
    timeout_s: float | None = 60.0
    context_param: str | None = None
    client: bool = False  # no server-side run: the turn parks until its caller sends the result (Client.resume)
    editable: bool = False  # a reviewer may approve a gated call with edited arguments (re-validated, re-bound)
    required_features: tuple[str, ...] = ()  # a caller lacking any of these never sees the tool
    module: str = ""  # the module that declared it: agents of other modules may declare their own of this name
    strict: bool | None = None  # provider-native strict arguments; None: the agent's `strict_tools` decides
    _validator: Any = field(default=None, repr=False)

    def validate(self, args: Any) -> dict[str, Any]:
        """Return the validated (and for pydantic tools, coerced) arguments or raise ToolArgumentError."""
        if not isinstance(args, dict):
            raise ToolArgumentError(f"arguments must be a JSON object, got {type(args).__name__}")
        if self.args_model is not None:
            try:
                return self.args_model.model_validate(args).model_dump(mode="json")
            except ValidationError as exc:
                raise ToolArgumentError(_describe_validation(exc)) from None
        if self._validator is None:
            self._validator = jsonschema.Draft202012Validator(self.input_schema)
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            raise ToolArgumentError(
                "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors)
            )
        return args

    def available_to(self, features: Collection[str] | None) -> bool:
        """Whether a caller with these features may see the tool (None: any caller, as when checking a definition)."""
        return features is None or set(self.required_features) <= set(features)

    def requires_approval(self, args: dict[str, Any]) -> bool:
        if callable(self.needs_approval):
            return bool(self.needs_approval(args))
        return bool(self.needs_approval)

    def invoke(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = dict(args)
        if self.context_param:
            kwargs[self.context_param] = ctx
        return self.fn(**kwargs)


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _schema_from_signature(fn: Callable[..., Any]) -> tuple[type[BaseModel], str | None]:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    context_param = None
    for name, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(name, Any)
        if annotation is ToolContext:
            context_param = name
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise DefinitionError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, default)
    model = create_model(f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields)
    return model, context_param


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    args_model: type[BaseModel] | None = None,
    input_schema: dict[str, Any] | None = None,
    is_mutation: bool = False,
    destructive: bool = False,
    needs_approval: bool | ApprovalPredicate = False,
    timeout_s: float | None = 60.0,
    client: bool = False,
    editable: bool = False,
    required_features: Collection[str] = (),
    strict: bool | None = None,
) -> Any:
    """Declare a tool. Its schema comes from `args_model`, `input_schema`, or the type hints.

    `client=True` declares a client-side tool: the function is never run (its signature and docstring
    describe the tool); a call parks the turn until its caller supplies the result with `Client.resume`.
    `editable=True` lets a reviewer approve a gated call with other arguments (`Client.approve(args=...)`).
    `required_features`: features a turn's caller must have for the model to be shown the tool (and for a
    call to it to run); other callers' turns never see it.
    `strict=True` asks providers with a strict mode (OpenAI, Anthropic) to constrain the model's arguments to
    the schema (checked strict-compatible when an agent listing the tool loads); None leaves it to the agent's
    `strict_tools`. Without a strict mode (Gemini, Bedrock) the arguments are validated here, as always."""
    if isinstance(required_features, str):
        raise DefinitionError("required_features must be a list of feature names, not one string")

    def wrap(func: Callable[..., Any]) -> ToolDefinition:
        model = args_model
        context_param = None
        hints = get_type_hints(func)
        for pname in inspect.signature(func).parameters:
            if hints.get(pname) is ToolContext:
                context_param = pname
        if input_schema is not None:
            schema = input_schema
            model = None
        else:
            if model is None:
                model, context_param = _schema_from_signature(func)
            schema = model.model_json_schema()
        schema = {k: v for k, v in schema.items() if k != "title"}
        tool_name = name or func.__name__
        desc = description or inspect.getdoc(func) or ""
        if not desc:
            raise DefinitionError(f"tool {tool_name}: a description (or docstring) is required")
        if model is None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise DefinitionError(f"tool {tool_name}: invalid input_schema: {exc.message}") from None
        definition = ToolDefinition(
            name=tool_name,
            description=desc,
            input_schema=schema,
            fn=func,
            args_model=model,
            is_mutation=is_mutation,
            destructive=destructive,
            needs_approval=needs_approval,
            timeout_s=timeout_s,
            context_param=context_param,
            client=client,
            editable=editable,
            required_features=tuple(required_features),
            module=func.__module__,
            strict=strict,
        )
        if client and (is_mutation or destructive or needs_approval):
            raise DefinitionError(
                f"tool {tool_name}: a client-side tool runs at the caller, so it cannot be a mutation or need "
                "approval here; gate it in the client"
            )
        register_tool(definition)
        return definition

    if fn is not None:
        return wrap(fn)
    return wrap


def client_tool(
    name: str,
    description: str,
    *,
    input_schema: dict[str, Any] | None = None,
    args_model: type[BaseModel] | None = None,
) -> ToolDefinition:
    """Declare a schema-only, client-side tool (a tool without an implementation here): when the model calls
    it, the turn parks (`awaiting_tool_results`) until its caller supplies the result with `Client.resume`
    (`POST /v1/turns/{id}/tool-results`). The schema comes from `input_schema` or `args_model`."""
    if (input_schema is None) == (args_model is None):
        raise DefinitionError(f"client tool {name}: give exactly one of input_schema or args_model")

    def not_here(**_: Any) -> Any:
        raise RuntimeError(f"{name} is a client-side tool: its caller runs it and sends the result")

    not_here.__name__ = name
    not_here.__module__ = sys._getframe(1).f_globals.get("__name__", __name__)  # declared by the caller's module
    return cast(
        ToolDefinition,
        tool(
            not_here, name=name, description=description, input_schema=input_schema, args_model=args_model, client=True
        ),
    )


# Tools by name, then by the module that declared them: two modules may each declare a `lookup_order`, and each
# agent runs the one its own module declares or imports (see `stepq.agents.definition`).
_TOOLS: dict[str, dict[str, ToolDefinition]] = {}
# Tools replaced (or disabled: None) by a module's `tool_overrides`, set by the agent registry when it loads
# modules (see stepq.agents.extensions). Process-wide, like the tools themselves: an override applies to every agent
# listing the name.
_OVERRIDES: dict[str, ToolDefinition | None] = {}


def register_tool(definition: ToolDefinition) -> None:
    """Record a declaration; the same function declared again (a module imported twice) replaces itself."""
    declared = _TOOLS.setdefault(definition.name, {})
    existing = declared.get(definition.module)
    if (
        existing is not None
        and existing.fn is not definition.fn
        and getattr(existing.fn, "__qualname__", None) != getattr(definition.fn, "__qualname__", None)
    ):
        raise DefinitionError(f"tool name {definition.name!r} is declared twice in {definition.module}")
    declared[definition.module] = definition


def declarations(name: str) -> dict[str, ToolDefinition]:
    """Every declaration of a tool name, by declaring module (before any override)."""
    return dict(_TOOLS.get(name, {}))


def get_tool(name: str, module: str | None = None) -> ToolDefinition | None:
    """The tool run under this name: a module's override if one replaced it (None if one disabled it), else the
    declaration of `module`, else the only declaration of the name (None when several modules declare it)."""
    if name in _OVERRIDES:
        return _OVERRIDES[name]
    declared = _TOOLS.get(name, {})
    if module in declared:
        return declared[module]
    return next(iter(declared.values())) if len(declared) == 1 else None


def declared_tools() -> dict[str, dict[str, ToolDefinition]]:
    """Every tool as its modules declared it, before any override: name -> declaring module -> definition."""
    return {name: dict(by_module) for name, by_module in _TOOLS.items()}


def tool_overrides() -> dict[str, ToolDefinition | None]:
    return dict(_OVERRIDES)


def set_tool_overrides(overrides: Mapping[str, ToolDefinition | None]) -> None:
    """Replace the overrides in force (the agent registry's job: stepq.agents.extensions resolves them)."""
    _OVERRIDES.clear()
    _OVERRIDES.update(overrides)
