"""An agent for fork and export tests (id `ls.fork`): its model answers from the transcript, so what a fork
or a replay produces follows from the messages it is given, and its tool counts every run in Redis."""

from __future__ import annotations

import redis

from stepq.agents.definition import AgentDefinition
from stepq.agents.tools import ToolContext, tool
from stepq.models import ToolResultMessage
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptToolCall

REDIS_URL = "redis://127.0.0.1:6379/0"
_redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)


def runs_key(prefix: str) -> str:
    """Where `ls_lookup` counts its runs: across every turn of a test (a fork is another turn)."""
    return f"{prefix}:ls-lookup-runs"


@tool
def ls_lookup(city: str, ctx: ToolContext) -> dict[str, object]:
    """Look up a city's weather (counts each run: a re-run would show)."""
    runs = _redis.incr(runs_key(str(ctx.metadata["prefix"])))
    return {"city": city, "forecast": "sunny", "run": runs}


def _answer(request: FunctionRequest) -> FunctionResponse:
    """Look the city up first; once a result is in the transcript, answer with it and the user's last words."""
    results = [r for m in request.messages if isinstance(m, ToolResultMessage) for r in m.results]
    if not results:
        return FunctionResponse(tool_calls=[ScriptToolCall(name="ls_lookup", args={"city": "Paris"})])
    last_user = [m for m in request.messages if m.role == "user"][-1]
    return FunctionResponse(
        text=f"{last_user.content}: {results[-1].output['forecast']} (run {results[-1].output['run']})"
    )


fork = AgentDefinition(
    id="ls.fork",
    system_prompt="Answer with the forecast.",
    allowed_tools=["ls_lookup"],
    function_model=FunctionModel(_answer),
)
