"""Errors a caller can act on. Messages name the problem and what to do, and never carry secrets.

Every error stepq raises on purpose derives from `StepqError`, so `except StepqError` catches
them all. The tree (a second base in brackets keeps older `except ValueError` code working):

    StepqError
    ├── ConfigurationError          a STEPQ_* setting or the installed extras cannot work
    │   └── MissingExtraError        a feature's optional dependencies are not installed
    ├── DefinitionError             an agent or tool definition is invalid (at load, not at call)
    ├── SubmitError [ValueError]    a submit was refused; nothing was stored
    │   ├── UnknownAgentError
    │   ├── MissingFeaturesError
    │   ├── OverrideError           a caller override tried to widen the agent's loop (or a policy's limit)
    │   ├── PolicyError             a policy refused the submit (kill switch, model, runtime overrides off)
    │   ├── AttachmentError         a file was refused (`.unsupported_type`: its media type was why)
    │   ├── TranscriptError         `messages` hold a tool call without a result, or a result without a call
    │   ├── ContextError            `context=` does not match the agent's `context_schema` (HTTP 422)
    │   └── QuotaExceededError      the tenant's (or agent's) usage quota is spent until `.resets_at` (HTTP 429)
    ├── TurnNotFoundError [LookupError]
    ├── ThreadNotFoundError [LookupError]  unknown, expired, or another tenant's
    ├── ThreadBusyError              a turn of the thread is running and the policy is `reject`
    ├── EventCursorError [ValueError]    an events cursor is negative, not a number, or past the end
    ├── WaitTimeoutError [TimeoutError]  a wait ran out of time (`wait(timeout=)`, `events(idle_timeout=)`,
    │   │                                `ApprovalReceipt.wait`); the turn itself goes on
    │   └── NoWorkerError            embedded mode: no worker in this process can run the turn
    ├── StoreUnavailableError [ConnectionError]  Redis stayed unreachable for the whole outage window
    ├── ApprovalError               a decision was refused; `.code` is an `ApprovalRefusal`
    ├── ToolResultsError            client-side tool results were refused; `.code` is a `ToolResultsRefusal`
    ├── ToolArgumentError [ValueError]   the model's tool arguments do not match the schema
    ├── ToolCancelledError           raised in a tool whose call was cancelled (`ctx.run_process` killed it)
    ├── InvalidOutputError [ValueError]  an object-mode answer does not match the output schema
    └── ProviderError               a classified model-provider failure (`.retryable`, `.status`,
                                    `.retry_after_s`, `.code`)

Inside a turn, `ToolArgumentError`, `InvalidOutputError` and `ProviderError` are handled by the
worker (a tool error the model reads, a repair step, a retry or a failed turn); a caller sees them
when calling the same functions directly, and as the text of `TurnResult.error`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

# The modules each optional extra brings (pyproject.toml): a ModuleNotFoundError for one of them is a
# missing extra, not a bug.
EXTRA_MODULES = {
    "fastapi": "gateway",
    "starlette": "gateway",
    "uvicorn": "gateway",
    "jwt": "gateway",
    "fakeredis": "embedded",
    "lupa": "embedded",
    "gevent": "gevent",
    "anthropic": "anthropic",
    "google.genai": "gemini",
    "boto3": "bedrock",
    "botocore": "bedrock",
    "openai": "openai",
    "mcp": "mcp",
    "cryptography": "tenant-keys",
}


class StepqError(Exception):
    """Base of every error stepq raises on purpose."""


class ConfigurationError(StepqError):
    """A setting (or the installed set of extras) cannot work; raised at start, before any turn runs."""


class MissingExtraError(ConfigurationError):
    """A feature needs an optional dependency group: the message names the `pip install` to run."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the {extra} extra: {install_command(extra)}")
        self.extra = extra


def install_command(extra: str) -> str:
    """The pip command that adds an extra to this installation: a source checkout (an editable install, as
    `make demo` makes) reinstalls itself, anything else installs the published package's extra."""
    checkout = _checkout()
    if checkout is None:
        return f"pip install 'stepq[{extra}]'"
    return f"pip install -e '.[{extra}]' (in {checkout})"


def _checkout() -> Path | None:
    """The source tree this module is imported from (shared/ next to pyproject.toml), or None when installed."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "shared").is_dir() else None


def extra_providing(module: str | None) -> str | None:
    """The extra whose dependency `module` (a ModuleNotFoundError's `.name`) is, or None."""
    parts = (module or "").split(".")
    for n in range(len(parts), 0, -1):
        extra = EXTRA_MODULES.get(".".join(parts[:n]))
        if extra is not None:
            return extra
    return None


class DefinitionError(StepqError):
    """An agent or tool definition is invalid; raised at load time, not at call time."""


class SubmitError(StepqError, ValueError):
    """A submit request was refused; nothing was stored."""


class UnknownAgentError(SubmitError):
    """No loaded agent module defines this agent id."""


class MissingFeaturesError(SubmitError):
    """The agent's `required_features` are not all among the caller's features."""


class OverrideError(SubmitError):
    """A caller override tried to widen what the agent definition allows."""


class PolicyError(SubmitError):
    """A caller's, tenant's or the environment's policy refused the submit: the kill switch is on, the model is
    not on an allowlist, or per-call overrides are off. The message names the layer."""


class ContextError(SubmitError):
    """A runtime context that does not match the agent's `context_schema` (or is not a JSON object)."""


class QuotaExceededError(SubmitError):
    """A usage quota (tokens or cost over a window) is spent; it resets at `resets_at` (epoch seconds)."""

    def __init__(self, message: str, *, resets_at: float, retry_after_s: float) -> None:
        super().__init__(message)
        self.resets_at = resets_at
        self.retry_after_s = retry_after_s


class AttachmentError(SubmitError):
    """A file was refused at submit: its type (`unsupported_type` is then True; HTTP 415), its size, its
    URL, or a provider that cannot take files."""

    def __init__(self, message: str, *, unsupported_type: bool = False) -> None:
        super().__init__(message)
        self.unsupported_type = unsupported_type


class TranscriptError(SubmitError):
    """`messages` pair their tool calls and results badly: a call with no result after it (an open call), or a
    result naming no call before it. `entries` lists each problem (`messages[i]...: what`); HTTP 422."""

    def __init__(self, message: str, *, entries: list[str]) -> None:
        super().__init__(message)
        self.entries = entries


class TurnNotFoundError(StepqError, LookupError):
    """No such turn: never created, or expired after its TTL."""


class EventCursorError(StepqError, ValueError):
    """An events cursor (`after=`) that is not a seq of the turn: negative, not an integer, or past its end."""


class ThreadNotFoundError(StepqError, LookupError):
    """No such thread: never created, expired after its TTL, or another tenant's (the same answer)."""


class ThreadBusyError(StepqError):
    """A turn of the thread is still running and the double-texting policy is `reject`."""

    def __init__(self, message: str, running_turn_id: str) -> None:
        super().__init__(message)
        self.running_turn_id = running_turn_id


class WaitTimeoutError(StepqError, TimeoutError):
    """A wait ran out of time: `Client.wait(timeout=)`, `events(idle_timeout=)`, `ApprovalReceipt.wait`.
    Only the caller stopped waiting; the turn (or the decision) goes on."""


class NoWorkerError(WaitTimeoutError):
    """Embedded mode: the turn is not finished and no worker runs in this process to finish it."""


class StoreUnavailableError(StepqError, ConnectionError):
    """Redis did not answer for the whole outage window (STEPQ_REDIS_OUTAGE_S): a real outage, not a blip.

    Raised by the client instead of redis-py's own errors; inside a worker it is never taken for a
    provider failure (the step is left to the sweeper, which re-runs it once Redis is back)."""


class BrokerUnavailableError(StepqError, ConnectionError):
    """The broker (STEPQ_BROKER_URL) refused the connection that sends a step or a decision.

    Raised by the client instead of kombu's own error. What was stored stays stored: a submitted turn
    waits as `queued` and the workers' sweeper sends its step once the broker is back."""


class ApprovalRefusal(StrEnum):
    """Why an approval decision was refused (the `code` of ApprovalError, the CLI's and the API's reply).

    The values are wire strings: they travel in the approve task's reply. Add members here;
    never parse a refusal out of a message.
    """

    UNKNOWN = "unknown"  # no such approval id (never created, or expired after retention)
    INVALID_TOKEN = "invalid-token"  # the token does not verify for this approval
    CHANGED_ARGS = "changed-args"  # the decision names arguments other than the requested ones (not editable)
    INVALID_ARGS = "invalid-args"  # edited arguments for an editable tool do not match its schema
    NOT_PENDING = "not-pending"  # already approved, denied or expired
    EXPIRED = "expired"  # it expired before this decision; it resolves as a denial
    TURN_NOT_WAITING = "turn-not-waiting"  # its turn was cancelled or finished: the approval was cancelled


class ApprovalError(StepqError):
    """An approval decision was refused; `code` says why."""

    def __init__(self, code: ApprovalRefusal | str, message: str) -> None:
        super().__init__(message)
        self.code = ApprovalRefusal(code)

    @classmethod
    def unknown(cls, approval_id: object) -> ApprovalError:
        """No approval has this id (never created, or expired after retention)."""
        return cls(ApprovalRefusal.UNKNOWN, f"unknown approval id {approval_id!r}")


class ToolResultsRefusal(StrEnum):
    """Why client-side tool results were refused (the `code` of ToolResultsError and the API's reply)."""

    NOT_WAITING = "turn-not-waiting"  # the turn is not parked on client-side tool calls (finished, or running)
    UNKNOWN_CALL = "unknown-call"  # a result names a call id the turn is not waiting for
    ALREADY_ANSWERED = "already-answered"  # a call already has its result (another submit won)
    MISSING = "missing-results"  # an open call has no result: every open call is answered at once
    EXPIRED = "expired"  # the calls expired; the model was told no result came
    INVALID = "invalid-result"  # a result is not JSON, or `errors` names a call without a result


class ToolResultsError(StepqError):
    """Client-side tool results were refused before the model was asked; `code` says why and `call_ids`
    names the calls concerned. Nothing was stored."""

    def __init__(self, code: ToolResultsRefusal | str, message: str, call_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = ToolResultsRefusal(code)
        self.call_ids = call_ids or []


class ToolArgumentError(StepqError, ValueError):
    """The model's arguments do not match the tool's schema (the model reads it as a tool error)."""


class ToolCancelledError(StepqError):
    """Inside a tool: its call was cancelled (timed out, or its turn cancelled) and its work was stopped."""


class InvalidOutputError(StepqError, ValueError):
    """An object-mode answer is not valid JSON or does not match the agent's output schema."""


class ProviderError(StepqError):
    """A classified provider failure. `retryable` decides whether the engine may retry before content."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after_s: float | None = None,
        code: str | None = None,
        usage: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s
        self.code = code
        # a `stepq.models.Usage` the provider reported before failing (billed: the engine counts it)
        self.usage = usage

    def describe(self) -> str:
        bits = [self.message]
        if self.status is not None:
            bits.append(f"status={self.status}")
        if self.code:
            bits.append(f"code={self.code}")
        return " ".join(bits)
