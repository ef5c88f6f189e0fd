"""Offline models that answer the request: `FunctionModel` runs a function of the transcript, tools and
schema; `TestModel` derives tool arguments from the prompt and objects from the schema and the input,
so different inputs give different objects (here 50 batch-like items through real workers)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from stepq import FunctionModel, FunctionRequest, FunctionResponse, TestModel, TurnStatus
from stepq.agents.demo import Lead
from stepq.models import EventType, ToolSpec, UserMessage
from stepq.providers.base import OUTPUT_TOOL, StepRequest
from stepq.providers.function import build_object

WAIT = 120
CITIES = ["Lyon", "Porto", "Turin", "Ghent", "Leeds"]


def _item(i: int) -> str:
    return f"company: Firm {i} GmbH, city: {CITIES[i % 5]}, employees: {10 + 7 * i}"


def test_fifty_items_give_fifty_input_dependent_objects(worker, client):
    handles = [client.submit("demo.enricher", prompt=_item(i)) for i in range(50)]
    results = [h.wait(timeout=WAIT) for h in handles]
    assert all(r.status == TurnStatus.COMPLETED for r in results), [r.error for r in results if r.error]
    schema = Lead.model_json_schema()
    objects = [r.object for r in results]
    for i, obj in enumerate(objects):
        jsonschema.validate(obj, schema)
        Lead.model_validate(obj)
        assert obj["company"] == f"Firm {i} GmbH"  # from the item's own text
        assert obj["city"] == CITIES[i % 5]
        assert obj["employees"] == 10 + 7 * i
    assert len({repr(sorted(o.items())) for o in objects}) == 50
    assert all(r.provider == "function" for r in (client.get(h.turn_id) for h in handles[:3]))


def test_tool_arguments_come_from_the_prompt(worker, client):
    handle = client.submit("demo.enricher", prompt=_item(7))
    result = handle.wait(timeout=WAIT)
    [call] = [e for e in handle.events() if e.type == EventType.TOOL_CALL]
    assert call.data["name"] == "company_domain" and call.data["args"] == {"company": "Firm 7 GmbH"}
    [tool] = [e for e in handle.events() if e.type == EventType.TOOL_RESULT]
    assert tool.data["output"]["domain"] == "firm7gmbh.example"
    assert result.object["company"] == "Firm 7 GmbH"


def test_test_model_honours_the_forced_answer_and_schema_keywords():
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 2},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "kind": {"enum": ["a", "b", "c"]},
            "email": {"type": "string", "format": "email"},
            "ref": {"$ref": "#/$defs/Ref"},
            "maybe": {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "null"}]},
        },
        "required": ["tags", "score", "kind", "email", "ref", "maybe"],
        "$defs": {"Ref": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
    }
    seen = set()
    for i in range(20):
        value = build_object(schema, f"order {i} from ada{i}@example.org, priority {i * 3}")
        jsonschema.validate(value, schema)
        assert value["email"] == f"ada{i}@example.org"
        seen.add(repr(value))
    assert len(seen) == 20
    tool = ToolSpec(
        name="lookup", description="", input_schema={"type": "object", "properties": {"q": {"type": "string"}}}
    )
    request = StepRequest(
        provider="test",
        model="test",
        messages=[UserMessage(content="q: pumpkins")],
        tools=[tool, ToolSpec(name=OUTPUT_TOOL, description="", input_schema=schema)],
        tool_choice=OUTPUT_TOOL,
        output_schema=schema,
    )
    deltas: list[Any] = []
    forced = TestModel().stream_step(request, deltas.append, lambda: False)
    [answer] = forced.message.tool_calls
    assert answer.name == OUTPUT_TOOL and {d.kind for d in deltas} == {"object"}
    free = TestModel().stream_step(request.model_copy(update={"tool_choice": "auto"}), deltas.append, lambda: False)
    [call] = free.message.tool_calls
    assert call.name == "lookup" and call.args == {"q": "pumpkins"}


def test_function_model_sees_messages_tools_and_schema():
    asked: list[FunctionRequest] = []

    def fn(request: FunctionRequest) -> FunctionResponse | str:
        asked.append(request)
        return f"{len(request.tools)} tools, prompt {request.prompt!r}"

    request = StepRequest(provider="function", model="function", messages=[UserMessage(content="hello there")])
    deltas: list[Any] = []
    out = FunctionModel(fn).stream_step(request, deltas.append, lambda: False)
    assert out.message.text == "0 tools, prompt 'hello there'" == "".join(d.text for d in deltas)
    assert asked[0].output_schema is None and asked[0].answer_now is False


def test_the_function_provider_without_a_function_is_refused_at_submit():
    import pytest

    from stepq import AgentDefinition, SubmitError
    from stepq.providers.registry import resolve_model

    agent = AgentDefinition(id="fnt.none", default_provider="function")
    with pytest.raises(SubmitError, match="function_model"):
        resolve_model(agent, None, None, None, None)
    assert resolve_model(agent.model_copy(update={"function_model": TestModel()}), None, None, None, None) == (
        "function",
        "function",
    )
    assert resolve_model(AgentDefinition(id="fnt.any", default_provider="test"), None, None, None, None) == (
        "test",
        "test",
    )


def test_a_function_models_tool_call_streams_its_arguments_before_the_call(worker, client):
    """Offline users and the demo see tool input stream as a provider's would: the call's JSON in pieces."""
    handle = client.submit("demo.enricher", prompt=_item(3))
    assert handle.wait(timeout=WAIT).status == TurnStatus.COMPLETED
    events = list(handle.events())
    [call] = [e for e in events if e.type == EventType.TOOL_CALL]
    pieces = [e for e in events if e.type == EventType.TOOL_INPUT_DELTA]
    assert pieces and {(e.data["id"], e.data["name"]) for e in pieces} == {(call.data["id"], "company_domain")}
    assert json.loads("".join(e.data["text"] for e in pieces)) == call.data["args"] == {"company": "Firm 3 GmbH"}
    assert max(e.seq for e in pieces) < call.seq
