"""agentq's library: definitions, engine, providers and the Redis store. No Celery imports here."""

from shared.agents import AgentDefinition, Budget, LoopConfig, StopWhen
from shared.tools import ToolContext, ToolDefinition, tool

__all__ = ["AgentDefinition", "Budget", "LoopConfig", "StopWhen", "ToolContext", "ToolDefinition", "tool"]
