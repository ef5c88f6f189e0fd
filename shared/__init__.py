"""stepq: durable LLM agent loops on Celery workers with Redis, one loop step at a time, each committed.

The names below are the public API: what an application, an agent module or a test writes code
against. Everything else (`stepq.engine`, `stepq.store`, `stepq.providers`, `stepq.workers`, the
CLI's modules...) is internal and may change without notice.
"""

if __name__ != "stepq":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq, not {__name__}: this folder is installed as the package stepq")

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from stepq.agents.definition import AgentDefinition, Budget, LoopConfig, StopWhen
from stepq.agents.extensions import AgentExtension, Suggestion
from stepq.agents.hooks import ModelRequested, StepFinished, StepStarted, ToolResulted, fails_turn
from stepq.agents.mcp import McpServer, McpTool
from stepq.agents.runtime_context import CallContext, CallOverrides
from stepq.agents.step_control import StepContext, StepOverrides
from stepq.agents.stops import StopContext, stop_condition
from stepq.agents.tool_paths import confined_path
from stepq.agents.tools import ToolContext, ToolDefinition, client_tool, tool
from stepq.config.settings import Settings
from stepq.errors import (
    ApprovalError,
    ApprovalRefusal,
    AttachmentError,
    BrokerUnavailableError,
    ConfigurationError,
    ContextError,
    DefinitionError,
    EventCursorError,
    InvalidOutputError,
    MissingExtraError,
    MissingFeaturesError,
    NoWorkerError,
    OverrideError,
    PolicyError,
    ProviderError,
    QuotaExceededError,
    StepqError,
    StoreUnavailableError,
    SubmitError,
    ThreadBusyError,
    ThreadNotFoundError,
    ToolArgumentError,
    ToolCancelledError,
    ToolResultsError,
    ToolResultsRefusal,
    TranscriptError,
    TurnNotFoundError,
    UnknownAgentError,
    WaitTimeoutError,
)
from stepq.fleet.ratelimit import RateLimit
from stepq.models import (
    Event,
    EventType,
    FailedAttempt,
    FinishReason,
    LoopStop,
    Policy,
    StepTrace,
    ToolCall,
    ToolResultStatus,
    TurnResult,
    TurnState,
    TurnStatus,
    Usage,
)
from stepq.producer.client import ApprovalReceipt, Client, TurnHandle
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse, TestModel
from stepq.providers.replay import Replay, load_case, replay_case
from stepq.providers.scripted import ScriptFailure, ScriptStep, ScriptToolCall
from stepq.turns.attachments import Attachment
from stepq.turns.listings import ApprovalItem, Listing, ThreadItem, TurnItem
from stepq.turns.submit import LoopOverrides
from stepq.turns.threads import Multitask, Thread, ThreadTurn

try:
    __version__ = _version("stepq")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AgentDefinition",
    "AgentExtension",
    "ApprovalError",
    "ApprovalItem",
    "ApprovalReceipt",
    "ApprovalRefusal",
    "Attachment",
    "AttachmentError",
    "BrokerUnavailableError",
    "Budget",
    "CallContext",
    "CallOverrides",
    "Client",
    "ConfigurationError",
    "ContextError",
    "DefinitionError",
    "Event",
    "EventCursorError",
    "EventType",
    "FailedAttempt",
    "FinishReason",
    "FunctionModel",
    "FunctionRequest",
    "FunctionResponse",
    "InvalidOutputError",
    "Listing",
    "LoopConfig",
    "LoopOverrides",
    "LoopStop",
    "McpServer",
    "McpTool",
    "MissingExtraError",
    "MissingFeaturesError",
    "ModelRequested",
    "Multitask",
    "NoWorkerError",
    "OverrideError",
    "Policy",
    "PolicyError",
    "ProviderError",
    "QuotaExceededError",
    "RateLimit",
    "Replay",
    "ScriptFailure",
    "ScriptStep",
    "ScriptToolCall",
    "Settings",
    "StepContext",
    "StepFinished",
    "StepOverrides",
    "StepStarted",
    "StepTrace",
    "StepqError",
    "StopContext",
    "StopWhen",
    "StoreUnavailableError",
    "SubmitError",
    "Suggestion",
    "TestModel",
    "Thread",
    "ThreadBusyError",
    "ThreadItem",
    "ThreadNotFoundError",
    "ThreadTurn",
    "ToolArgumentError",
    "ToolCall",
    "ToolCancelledError",
    "ToolContext",
    "ToolDefinition",
    "ToolResultStatus",
    "ToolResulted",
    "ToolResultsError",
    "ToolResultsRefusal",
    "TranscriptError",
    "TurnHandle",
    "TurnItem",
    "TurnNotFoundError",
    "TurnResult",
    "TurnState",
    "TurnStatus",
    "UnknownAgentError",
    "Usage",
    "WaitTimeoutError",
    "__version__",
    "client_tool",
    "confined_path",
    "fails_turn",
    "load_case",
    "replay_case",
    "stop_condition",
    "tool",
]
