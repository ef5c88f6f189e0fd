"""The Gemini SDK client and one step's request config, shared by the streamed adapter (`adapter`) and the
batch API (`batch`), so neither imports the other's module for them.

The client comes only from the SDK's standard environment; clients are cached per environment so
connections and Vertex access tokens are reused across steps (a step keeps its own reference while it
reads). The config carries the step's tools, limits, thinking and per-request timeouts.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

from google import genai
from google.genai import types

from stepq.errors import DefinitionError, SubmitError
from stepq.providers.base import OUTPUT_TOOL, ProviderError, StepRequest
from stepq.providers.gemini import schema as gemini_schema

DEFAULT_STALL_S = 60.0
DEFAULT_REQUEST_TIMEOUT_S = 600.0
_ENV = (
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_ENTERPRISE",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_VERTEX_BASE_URL",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_GENAI_API_VERSION",
)


# --------------------------------------------------------------------------- configuration


def _flag(name: str) -> bool | None:
    value = os.environ.get(name)
    return None if value is None else value.strip().lower() in ("true", "1")


def uses_vertex() -> bool:
    """The SDK's own rule: GOOGLE_GENAI_USE_ENTERPRISE wins over GOOGLE_GENAI_USE_VERTEXAI."""
    enterprise = _flag("GOOGLE_GENAI_USE_ENTERPRISE")
    return bool(enterprise if enterprise is not None else _flag("GOOGLE_GENAI_USE_VERTEXAI"))


def _has_key() -> bool:
    return any(os.environ.get(v, "").strip() for v in ("GOOGLE_API_KEY", "GEMINI_API_KEY"))


def check_configured() -> None:
    """Raise SubmitError naming the variables to set when neither AI Studio nor Vertex is configured."""
    if uses_vertex():
        if not os.environ.get("GOOGLE_CLOUD_PROJECT", "").strip() and not _has_key():
            raise SubmitError(
                "Gemini on Vertex AI is not configured: set GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION "
                "(with Application Default Credentials, e.g. GOOGLE_APPLICATION_CREDENTIALS), "
                "or GOOGLE_API_KEY for Vertex express mode"
            )
        return
    if not _has_key():
        raise SubmitError(
            "Gemini is not configured: set GOOGLE_API_KEY (or GEMINI_API_KEY) for AI Studio, or "
            "GOOGLE_GENAI_USE_VERTEXAI=true with GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION for Vertex AI"
        )


_CLIENTS: OrderedDict[str, genai.Client] = OrderedDict()
_CLIENTS_LOCK = threading.Lock()
_MAX_CLIENTS = 8


def _new_client() -> genai.Client:
    http_options = types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=1))
    if uses_vertex():
        project = os.environ.get("GOOGLE_CLOUD_PROJECT", "").strip()
        if project:
            # explicit project/location: with GOOGLE_VERTEX_BASE_URL and env-only values the SDK would
            # post to the bare base URL ("gateway" mode). The base URL itself still comes from the env.
            location = os.environ.get("GOOGLE_CLOUD_LOCATION", "").strip() or "global"
            return genai.Client(vertexai=True, project=project, location=location, http_options=http_options)
        return genai.Client(vertexai=True, http_options=http_options)  # express mode: API key from the env
    return genai.Client(http_options=http_options)


def get_client() -> genai.Client:
    """A client for the current environment, shared across steps (reuses connections and tokens)."""
    fingerprint = hashlib.sha256("\0".join(os.environ.get(v, "") for v in _ENV).encode()).hexdigest()
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(fingerprint)
        if client is not None:
            _CLIENTS.move_to_end(fingerprint)
            return client
    client = _new_client()
    with _CLIENTS_LOCK:
        _CLIENTS[fingerprint] = client
        while len(_CLIENTS) > _MAX_CLIENTS:
            _CLIENTS.popitem(last=False)  # a step still reading holds its own reference
    return client


# --------------------------------------------------------------------------- one step's config


def _tool_config(choice: str | None, names: dict[str, str]) -> types.ToolConfig | None:
    if choice is None or not names:
        return None
    mode = types.FunctionCallingConfigMode
    modes = {"auto": mode.AUTO, "none": mode.NONE, "required": mode.ANY}
    if choice in modes:
        return types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode=modes[choice]))
    wire = gemini_schema.wire_name(choice)
    return types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode=mode.ANY, allowed_function_names=[wire])
    )


# the provider-neutral reasoning effort as Gemini's thinkingLevel
THINKING_LEVELS = {
    "minimal": types.ThinkingLevel.MINIMAL,
    "low": types.ThinkingLevel.LOW,
    "medium": types.ThinkingLevel.MEDIUM,
    "high": types.ThinkingLevel.HIGH,
}


def _thinking(request: StepRequest) -> types.ThinkingConfig | None:
    """thinkingConfig: the step's budget (`thinkingBudget`) and reasoning effort (`thinkingLevel`), else the
    provider options of those names."""
    options = request.options
    budget = request.sampling("thinking_budget")
    level = THINKING_LEVELS.get(request.reasoning_effort or "") or options.get("thinking_level")
    include = options.get("include_thoughts")
    if budget is None and level is None and include is None:
        return None
    return types.ThinkingConfig(
        include_thoughts=True if include is None else bool(include),
        thinking_budget=budget,
        thinking_level=level,
    )


def build_config(request: StepRequest, system: list[str]) -> types.GenerateContentConfig:
    """The GenerateContentConfig for one step (tools, limits, thinking, per-request timeouts)."""
    options = request.options
    declarations = []
    json_answer = answers_with_schema(request)
    for spec in [] if json_answer else request.tools:
        try:
            declarations.append(types.FunctionDeclaration.model_validate(gemini_schema.function_declaration(spec)))
        except DefinitionError as exc:
            raise ProviderError(str(exc), retryable=False, code="tool_schema") from None
    names = {gemini_schema.wire_name(t.name): t.name for t in request.tools}
    stall = float(options.get("stall_timeout_s", DEFAULT_STALL_S))
    first = float(options.get("first_chunk_timeout_s", stall))
    read_timeout_s = max(stall, first) + 5.0  # the socket gives up just after our watchdog would
    server_timeout_s = float(options.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S))
    config = types.GenerateContentConfig(
        system_instruction="\n\n".join(system) if system else None,
        tools=[types.Tool(function_declarations=declarations)] if declarations else None,
        tool_config=None if json_answer else _tool_config(request.tool_choice, names),
        max_output_tokens=request.max_tokens,
        temperature=request.temperature,
        stop_sequences=request.stop_sequences or None,
        top_p=request.sampling("top_p"),
        top_k=options.get("top_k"),
        seed=options.get("seed"),
        thinking_config=_thinking(request),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        http_options=types.HttpOptions(
            timeout=int(read_timeout_s * 1000),
            headers={"X-Server-Timeout": str(int(server_timeout_s))},  # else the SDK sends the socket timeout
        ),
    )
    if request.output_schema is not None and not declarations:
        config.response_mime_type = "application/json"
        config.response_json_schema = request.output_schema
    return config


def answers_with_schema(request: StepRequest) -> bool:
    """A forced structured answer goes out as Gemini's response schema + JSON output, not a function call
    (Gemini does not take function calling and a JSON response schema together)."""
    return request.output_schema is not None and request.tool_choice == OUTPUT_TOOL
