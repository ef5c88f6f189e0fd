"""Object-mode agents whose tool steps are cut short by a limit (ids `ans.*`, tools `ans_*`).

Their model is a `FunctionModel` that would call a tool forever unless the answer is forced: the only
way these turns end with an object is the reserved answer step.
"""

from __future__ import annotations

from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition, Budget, LoopConfig, StopWhen
from stepq.agents.tools import tool
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptToolCall


class AnsCount(BaseModel):
    lookups: int
    last: str


@tool
def ans_lookup(n: int) -> dict[str, int]:
    """Look a number up."""
    return {"n": n, "square": n * n}


def _tools_until_forced(request: FunctionRequest) -> FunctionResponse:
    """Calls the tool on every step; answers only when the answer is forced (counting its lookups)."""
    done = len(request.tool_results)
    if request.answer_now:
        return FunctionResponse(object={"lookups": done, "last": str(request.tool_results[-1]) if done else ""})
    return FunctionResponse(
        tool_calls=[ScriptToolCall(name="ans_lookup", args={"n": done + 1})], input_tokens=100, output_tokens=20
    )


def _invalid_first(request: FunctionRequest) -> FunctionResponse:
    """Forced to answer, the first answer misses a field; the repair gets it right."""
    repairing = any("did not match" in m.content for m in request.messages if m.role == "user")
    if request.answer_now or not request.tools:
        return FunctionResponse(object={"lookups": 1, "last": "ok"} if repairing else {"lookups": 1})
    return FunctionResponse(tool_calls=[ScriptToolCall(name="ans_lookup", args={"n": 1})])


_model = FunctionModel(_tools_until_forced)

step_count = AgentDefinition(
    id="ans.step_count",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=20, stop_when=[StopWhen(step_count=2)]),
    function_model=_model,
)

has_tool = AgentDefinition(
    id="ans.has_tool",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=20, stop_when=[StopWhen(has_tool_call="ans_lookup")]),
    function_model=_model,
)

# 120 tokens a tool step, the last step's 120 held back for the answer: three tool steps (360 + 120 >= 400)
token_budget = AgentDefinition(
    id="ans.token_budget",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=20, budget=Budget(max_tokens=400)),
    function_model=_model,
)

token_budget_reserve = AgentDefinition(
    id="ans.token_budget_reserve",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=20, budget=Budget(max_tokens=400, answer_reserve_tokens=200)),
    function_model=_model,
)

tool_budget = AgentDefinition(
    id="ans.tool_budget",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=20, budget=Budget(max_tool_calls=2)),
    function_model=_model,
)

max_steps = AgentDefinition(
    id="ans.max_steps",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=4),
    function_model=_model,
)

chat_step_count = AgentDefinition(
    id="ans.chat_step_count",
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=20, stop_when=[StopWhen(step_count=2)]),
    function_model=_model,
)

repaired = AgentDefinition(
    id="ans.repaired",
    execution_mode="object",
    output=AnsCount,
    allowed_tools=["ans_lookup"],
    loop=LoopConfig(max_steps=10, stop_when=[StopWhen(step_count=1)]),
    function_model=FunctionModel(_invalid_first),
)
