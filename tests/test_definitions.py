"""Agent and tool definitions: whitelist, read_only, mutation_policy, approval predicates,
tool schemas, and definitions that must be refused at load time."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import ValidationError

from stepq.agents.definition import AgentDefinition
from stepq.agents.registry import AgentRegistry
from stepq.agents.tools import get_tool, tool
from stepq.errors import DefinitionError
from stepq.models import AssistantMessage, EventType, TurnStatus
from stepq.providers.scripted import ScriptStep
from tests.agents_engine import drive, executions, start, tool_results


def _shown_tools(state, step: int = 0) -> list[str]:
    """The tool names the scripted model received at `step` (its echo_tools line)."""
    assistants = [m for m in state.messages if isinstance(m, AssistantMessage)]
    first_line = assistants[step].text.split("\n", 1)[0]
    assert first_line.startswith("tools: "), first_line
    names = first_line.removeprefix("tools: ")
    return names.split(",") if names else []


# --------------------------------------------------------------------------- allowed_tools


def test_unlisted_tool_is_never_shown_and_never_runs(rt, prefix):
    assert get_tool("eng_hidden") is not None  # registered, just not whitelisted
    turn_id = start(rt, "eng.whitelist", prefix)
    state = drive(rt, turn_id)

    assert state.status == TurnStatus.COMPLETED
    assert _shown_tools(state, 0) == ["eng_echo"]
    assert _shown_tools(state, 1) == ["eng_echo"]
    results = tool_results(state)
    hidden = results["call_0_0"]
    assert hidden.is_error and hidden.output == {"error": "Tool not found: eng_hidden"}
    assert executions(prefix, turn_id, "eng_hidden") == 0
    assert results["call_0_1"].output == {"echo": "hi"} and not results["call_0_1"].is_error
    step_start = next(e for e in rt.events.read(turn_id) if e.type == EventType.STEP_START)
    assert step_start.data["tools"] == ["eng_echo"]


# --------------------------------------------------------------------------- read_only / mutation_policy


def test_read_only_is_the_default():
    assert AgentDefinition(id="eng.tmp_default").read_only is True


def test_read_only_hides_mutation_and_destructive_tools(rt, prefix):
    turn_id = start(rt, "eng.read_only_default", prefix)
    state = drive(rt, turn_id)

    assert _shown_tools(state) == ["eng_echo"]
    results = tool_results(state)
    assert results["call_0_0"].output == {"error": "Tool not found: eng_write"}
    assert results["call_0_1"].output == {"error": "Tool not found: eng_wipe"}
    assert executions(prefix, turn_id, "eng_write") == 0
    assert executions(prefix, turn_id, "eng_wipe") == 0
    assert results["call_0_2"].output == {"echo": "e"}
    assert state.status == TurnStatus.COMPLETED


def test_policy_read_only_hides_mutations_even_when_read_only_is_false(rt, prefix):
    turn_id = start(rt, "eng.policy_read_only", prefix)
    state = drive(rt, turn_id)

    assert _shown_tools(state) == ["eng_echo"]
    assert tool_results(state)["call_0_0"].output == {"error": "Tool not found: eng_write"}
    assert executions(prefix, turn_id, "eng_write") == 0
    assert state.status == TurnStatus.COMPLETED


def _approval_requests(rt, turn_id: str) -> dict[str, dict]:
    return {e.data["tool"]: e.data for e in rt.events.read(turn_id) if e.type == EventType.APPROVAL_REQUEST}


def test_confirm_required_parks_every_mutation_call(rt, prefix):
    turn_id = start(rt, "eng.confirm", prefix)
    state = drive(rt, turn_id)

    assert _shown_tools(state_with_parked(state)) == ["eng_echo", "eng_write", "eng_wipe"]
    assert state.status == TurnStatus.AWAITING_APPROVAL
    assert state.parked is not None
    assert [a.tool_name for a in state.parked.approvals] == ["eng_write"]
    assert set(_approval_requests(rt, turn_id)) == {"eng_write"}
    assert executions(prefix, turn_id, "eng_write") == 0
    assert executions(prefix, turn_id, "eng_wipe") == 1  # destructive but not a mutation: runs under this policy


def test_destructive_confirm_required_also_parks_destructive_tools(rt, prefix):
    turn_id = start(rt, "eng.destructive_confirm", prefix)
    state = drive(rt, turn_id)

    assert state.status == TurnStatus.AWAITING_APPROVAL
    assert state.parked is not None
    assert sorted(a.tool_name for a in state.parked.approvals) == ["eng_wipe", "eng_write"]
    assert set(_approval_requests(rt, turn_id)) == {"eng_wipe", "eng_write"}
    assert executions(prefix, turn_id, "eng_write") == 0
    assert executions(prefix, turn_id, "eng_wipe") == 0
    # the read tool in the same step ran and its result is stored for the resume
    stored = rt.tool_results.get_many(turn_id, ["call_0_2"])
    assert stored["call_0_2"].output == {"echo": "e"}


def state_with_parked(state):
    """A parked step's assistant message is held in `parked`; put it back for inspection."""
    copy = state.model_copy(deep=True)
    if copy.parked is not None:
        copy.messages.append(copy.parked.assistant)
    return copy


def test_needs_approval_predicate_on_validated_args(rt, prefix):
    turn_id = start(rt, "eng.predicate", prefix)
    state = drive(rt, turn_id)

    assert state.status == TurnStatus.AWAITING_APPROVAL
    assert state.parked is not None
    assert [a.tool_call_id for a in state.parked.approvals] == ["large"]
    requests = [e.data for e in rt.events.read(turn_id) if e.type == EventType.APPROVAL_REQUEST]
    assert [(r["tool_call_id"], r["args"]) for r in requests] == [("large", {"amount": 500.0})]
    assert executions(prefix, turn_id, "eng_pay") == 1  # only the small payment ran
    assert rt.tool_results.get_many(turn_id, ["small"])["small"].output["amount"] == 50


# --------------------------------------------------------------------------- tool schemas


def test_schema_from_type_hints():
    definition = get_tool("eng_lookup")
    assert definition is not None
    schema = definition.input_schema
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"order_id", "limit", "note"}  # the ToolContext param is not shown
    assert schema["properties"]["order_id"]["type"] == "string"
    assert schema["properties"]["limit"]["type"] == "integer"
    assert schema["properties"]["limit"]["default"] == 5
    assert schema["required"] == ["order_id"]
    assert schema["additionalProperties"] is False
    assert definition.description == "Look up an order (schema derived from type hints)."


def test_schema_from_pydantic_model():
    definition = get_tool("eng_search")
    assert definition is not None
    props = definition.input_schema["properties"]
    assert props["query"]["minLength"] == 1
    assert props["query"]["description"] == "what to search for"
    assert props["limit"]["minimum"] == 1 and props["limit"]["maximum"] == 50
    assert definition.input_schema["required"] == ["query"]


def test_schemas_drive_validation_before_execution(rt, prefix):
    turn_id = start(rt, "eng.schemas", prefix)
    state = drive(rt, turn_id)

    assert _shown_tools(state) == ["eng_lookup", "eng_search"]
    results = tool_results(state)
    assert results["lk"].output["limit"] == 7  # "7" coerced by the type-hint model
    assert results["lk"].output["note"] is None
    assert results["s_ok"].output["limit"] == 5  # the pydantic default
    bad = results["s_bad"]
    assert bad.is_error
    assert "query" in bad.output["error"] and "limit" in bad.output["error"]
    assert executions(prefix, turn_id, "eng_search") == 1
    assert executions(prefix, turn_id, "eng_lookup") == 1


# --------------------------------------------------------------------------- refused definitions


def test_unknown_tool_in_allowed_tools_is_refused():
    agent = AgentDefinition(id="eng.tmp_unknown", allowed_tools=["eng_echo", "eng_no_such_tool"])
    with pytest.raises(DefinitionError, match="eng_no_such_tool"):
        AgentRegistry().register(agent)


def test_object_mode_without_output_is_refused():
    with pytest.raises(ValidationError, match="output"):
        AgentDefinition(id="eng.tmp_object", execution_mode="object")


def test_object_mode_with_an_invalid_json_schema_is_refused():
    with pytest.raises(ValidationError, match="output JSON schema is invalid"):
        AgentDefinition(id="eng.tmp_object", execution_mode="object", output={"type": "no-such-type"})


@pytest.mark.parametrize("bad_id", ["noseparator", "Eng.upper", "eng.", ".name", "eng.with-dash", "a.b.c", ""])
def test_bad_agent_id_is_refused(bad_id):
    with pytest.raises(ValidationError, match="agent id"):
        AgentDefinition(id=bad_id)


def test_bad_stop_condition_is_refused():
    with pytest.raises(ValidationError, match="exactly one"):
        AgentDefinition(id="eng.tmp_stop", loop={"stop_when": [{"step_count": 2, "has_tool_call": "eng_echo"}]})


def test_agent_defined_twice_is_refused():
    registry = AgentRegistry()
    registry.register(AgentDefinition(id="eng.tmp_twice"))
    with pytest.raises(DefinitionError, match="defined twice"):
        registry.register(AgentDefinition(id="eng.tmp_twice", description="another"))


def test_tool_without_description_is_refused():
    def eng_tmp_nodoc(x: int) -> int:
        return x

    with pytest.raises(DefinitionError, match="description"):
        tool(eng_tmp_nodoc)
    assert get_tool("eng_tmp_nodoc") is None


def test_tool_with_varargs_is_refused():
    def eng_tmp_varargs(*values: int) -> int:
        """Sum."""
        return sum(values)

    with pytest.raises(DefinitionError, match=r"\*args"):
        tool(eng_tmp_varargs)


def test_tool_with_an_invalid_input_schema_is_refused():
    def eng_tmp_badschema(x: int) -> int:
        """Echo."""
        return x

    with pytest.raises(DefinitionError, match="invalid input_schema"):
        tool(input_schema={"type": "object", "properties": {"x": {"type": 12}}})(eng_tmp_badschema)


def test_module_with_an_unknown_tool_reference_fails_at_load(tmp_path, monkeypatch):
    (tmp_path / "eng_tmp_badmodule.py").write_text(
        textwrap.dedent(
            """
            from stepq.agents.definition import AgentDefinition
            broken = AgentDefinition(id="eng_tmp.broken", allowed_tools=["eng_echo", "eng_missing_tool"])
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DefinitionError, match="eng_missing_tool"):
        AgentRegistry().load_modules(["eng_tmp_badmodule"])


def test_module_with_an_invalid_agent_fails_at_load(tmp_path, monkeypatch):
    (tmp_path / "eng_tmp_badobject.py").write_text(
        textwrap.dedent(
            """
            from stepq.agents.definition import AgentDefinition
            broken = AgentDefinition(id="eng_tmp.object", execution_mode="object")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises((DefinitionError, ValidationError), match="output"):
        AgentRegistry().load_modules(["eng_tmp_badobject"])


def test_missing_agent_module_fails_at_load():
    with pytest.raises(DefinitionError, match="eng_tmp_not_a_module"):
        AgentRegistry().load_modules(["eng_tmp_not_a_module"])


def test_scripted_steps_are_validated():
    with pytest.raises(ValidationError):
        ScriptStep(delta_chars=0)
