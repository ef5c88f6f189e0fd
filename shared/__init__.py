"""stepq's library: definitions, engine, providers and the Redis store. No Celery imports here."""

if __name__ != "stepq":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq, not {__name__}: this folder is installed as the package stepq")


from stepq.agents import AgentDefinition, Budget, LoopConfig, StopWhen
from stepq.tools import ToolContext, ToolDefinition, tool

__all__ = ["AgentDefinition", "Budget", "LoopConfig", "StopWhen", "ToolContext", "ToolDefinition", "tool"]
