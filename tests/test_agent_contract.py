"""The agent contract (issue 27): strict tool schemas and per-step sampling on each provider's wire (the official
SDKs against the wire fakes), their load-time and policy checks. In-process against real Redis."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from stepq.agents.definition import AgentDefinition
from stepq.agents.registry import AgentRegistry
from stepq.errors import DefinitionError, SubmitError, ToolResultsError, ToolResultsRefusal
from stepq.models import ToolResultStatus, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_contract import RAN, REPAIRS
from tests.conftest import eventually
from tests.fakes import anthropic_server as anth
from tests.fakes import bedrock_server as bed
from tests.fakes import gemini_server as gem
from tests.fakes import openai_server as oai
from tests.test_cli_errors import assert_one_line_failure, embedded_env, run
from tests.test_provider_openai import fake as openai_fake  # noqa: F401 - a fixture
from tests.test_step_control import _run_to_end
from tests.test_structured_output import anthropic_fake, bedrock_fake, gemini_fake  # noqa: F401 - fixtures


def _turn(rt: Any, agent: str, **kwargs: Any) -> Any:
    state, _ = create_turn(rt, agent, prompt="look order A1 up", **kwargs)
    done = _run_to_end(rt, state.turn_id)
    assert done.status == TurnStatus.COMPLETED, done.error
    return done


# --------------------------------------------------------------------------- strict tools


def _strict_of(tools: list[dict[str, Any]], key: str = "name") -> dict[str, Any]:
    return {(t.get("function") or t)[key]: (t.get("function") or t).get("strict") for t in tools}


def test_openai_responses_sends_strict_for_a_strict_tool_only(rt, openai_fake):  # noqa: F811
    openai_fake.enqueue(oai.response_text("done"))
    _turn(rt, "ac.strict_openai")
    [body] = openai_fake.bodies()
    assert _strict_of(body["tools"]) == {"ac_lookup": True, "ac_pair": False}  # the tool's own strict=True
    lookup = next(t for t in body["tools"] if t["name"] == "ac_lookup")
    assert lookup["parameters"]["additionalProperties"] is False
    assert lookup["parameters"]["required"] == ["order_id"]


def test_openai_chat_completions_sends_strict_for_every_tool_of_a_strict_agent(rt, openai_fake):  # noqa: F811
    openai_fake.enqueue(oai.chat_text("done"))
    _turn(rt, "ac.strict_openai_compatible")
    [body] = openai_fake.bodies()
    assert _strict_of(body["tools"]) == {"ac_lookup": True, "ac_pair": True}  # strict_tools=True


def test_anthropic_sends_strict_tools(rt, anthropic_fake):  # noqa: F811
    anthropic_fake.enqueue(anth.text_reply("done"))
    _turn(rt, "ac.strict_anthropic")
    [body] = anthropic_fake.bodies()
    assert _strict_of(body["tools"]) == {"ac_lookup": True, "ac_pair": True}


def test_gemini_has_no_strict_mode_so_the_engine_validates_the_arguments(rt, gemini_fake):  # noqa: F811
    gemini_fake.enqueue(
        gem.parts_reply(gem.function_call("ac_pair", {"left": "a", "right": "not a number"})),
        gem.text_reply("done"),
    )
    done = _turn(rt, "ac.strict_gemini")
    declared = gemini_fake.bodies()[0]["tools"][0]["functionDeclarations"]
    assert all("strict" not in d for d in declared)
    [result] = [r for m in done.messages if m.role == "tool" for r in m.results]
    assert result.status == ToolResultStatus.INVALID_ARGUMENTS  # refused before the tool ran
    assert "right" in result.output["error"]


def test_bedrock_has_no_strict_mode_and_declares_the_plain_schema(rt, bedrock_fake):  # noqa: F811
    bedrock_fake.add(bed.turn(bed.text_block(0, ["done"])))
    _turn(rt, "ac.strict_bedrock")
    [request] = bedrock_fake.requests
    assert all("strict" not in t["toolSpec"] for t in request.body["toolConfig"]["tools"])


@pytest.mark.parametrize(
    ("tools", "strict_tools", "problem"),
    [
        (["ac_note"], True, "tool 'ac_note': strict schemas need every property required; 'limit' is optional"),
        (["ac_lookup", "ac_pair"], False, None),  # ac_lookup is strict and strict-compatible
        (["ac_note", "ac_pair"], False, None),  # not strict: an optional argument is fine
    ],
)
def test_strict_schemas_are_checked_at_load(tools, strict_tools, problem):
    agent = AgentDefinition(id="ac.loadcheck", allowed_tools=tools, strict_tools=strict_tools)
    if problem is None:
        AgentRegistry().register(agent)
        return
    with pytest.raises(DefinitionError) as err:
        AgentRegistry().register(agent)
    assert str(err.value) == f"agent ac.loadcheck: {problem}"


def test_an_open_object_is_not_strict_compatible():
    from stepq.agents.strict_schema import strict_problem

    nested = {
        "type": "object",
        "properties": {"address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "required": ["address"],
        "additionalProperties": False,
    }
    assert strict_problem(nested) == (
        "strict schemas need additionalProperties false on every object; the object at 'address' allows more"
    )
    nested["properties"]["address"]["additionalProperties"] = False
    assert strict_problem(nested) is None


def test_the_cli_refuses_an_agent_whose_strict_tool_is_not_strict_compatible(tmp_path: Path):
    (tmp_path / "strictagents.py").write_text(
        "from stepq.agents.definition import AgentDefinition\n"
        "from stepq.agents.tools import tool\n\n"
        "@tool(strict=True)\n"
        "def lookup(order_id: str, limit: int = 5) -> str:\n"
        '    """Look an order up."""\n'
        "    return order_id\n\n"
        'agent = AgentDefinition(id="strictagents.desk", allowed_tools=["lookup"])\n'
    )
    proc = run(embedded_env(STEPQ_AGENT_MODULES="strictagents"), "agents", cwd=tmp_path)
    assert_one_line_failure(proc, "tool 'lookup': strict schemas need every property required; 'limit' is optional")
    assert proc.returncode == 2


# --------------------------------------------------------------------------- sampling per step

STEP0 = {"temperature": 0.3, "top_p": 0.8, "effort": "low", "thinking": 2048, "max": 4096}  # prepare_step's
STEP1 = {"temperature": 0.9, "top_p": 0.5, "effort": "high", "thinking": 1024, "max": 3000}  # the agent's


def test_anthropic_sampling_per_step(rt, anthropic_fake):  # noqa: F811
    anthropic_fake.enqueue(
        anth.stream(anth.tool_use_block(0, "toolu_1", "ac_lookup", ['{"order_id": "A1"}']), stop_reason="tool_use"),
        anth.text_reply("done"),
    )
    done = _turn(rt, "ac.sampling_anthropic")
    for body, want in zip(anthropic_fake.bodies(), (STEP0, STEP1), strict=True):
        assert body["max_tokens"] == want["max"]
        assert body["thinking"] == {"type": "enabled", "budget_tokens": want["thinking"]}
        assert body["output_config"] == {"effort": want["effort"]}
        assert "temperature" not in body and "top_p" not in body  # the Messages API takes no sampling parameters
    # ...and the trace says so instead of dropping them silently
    assert all("not sent, anthropic has no such field: temperature, top_p" in s.warnings for s in done.trace.steps)


def test_openai_responses_sampling_per_step(rt, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        oai.response_stream(oai.call_item("call_1", "ac_lookup", ['{"order_id": "A1"}'])), oai.response_text("done")
    )
    _turn(rt, "ac.sampling_openai")
    for body, want in zip(openai_fake.bodies(), (STEP0, STEP1), strict=True):
        assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (
            want["temperature"],
            want["top_p"],
            want["max"],
        )
        assert body["reasoning"]["effort"] == want["effort"]


def test_openai_chat_completions_sampling_per_step(rt, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        oai.chat_stream(oai.chat_tool_call("call_1", "ac_lookup", ['{"order_id": "A1"}']), finish="tool_calls"),
        oai.chat_text("done"),
    )
    _turn(rt, "ac.sampling_openai_compatible")
    for body, want in zip(openai_fake.bodies(), (STEP0, STEP1), strict=True):
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (
            want["temperature"],
            want["top_p"],
            want["max"],
        )
        assert body["reasoning_effort"] == want["effort"]


def test_gemini_sampling_per_step(rt, gemini_fake):  # noqa: F811
    gemini_fake.enqueue(gem.parts_reply(gem.function_call("ac_lookup", {"order_id": "A1"})), gem.text_reply("done"))
    _turn(rt, "ac.sampling_gemini")
    for body, want in zip(gemini_fake.bodies(), (STEP0, STEP1), strict=True):
        config = body["generationConfig"]
        assert (config["temperature"], config["topP"], config["maxOutputTokens"]) == (
            want["temperature"],
            want["top_p"],
            want["max"],
        )
        thinking = {k.replace("_", "").lower(): v for k, v in config["thinkingConfig"].items()}  # the SDK's spelling
        assert (thinking["thinkingbudget"], thinking["thinkinglevel"]) == (
            want["thinking"],
            str(want["effort"]).upper(),
        )


def test_bedrock_sampling_per_step(rt, bedrock_fake):  # noqa: F811
    bedrock_fake.add(
        bed.turn(bed.tool_block(0, "tu_1", "ac_lookup", {"order_id": "A1"}), stop="tool_use"),
        bed.turn(bed.text_block(0, ["done"])),
    )
    _turn(rt, "ac.sampling_bedrock")
    for request, want in zip(bedrock_fake.requests, (STEP0, STEP1), strict=True):
        assert request.body["inferenceConfig"] == {
            "maxTokens": want["max"],
            "temperature": want["temperature"],
            "topP": want["top_p"],
        }
        assert request.body["additionalModelRequestFields"]["thinking"] == {
            "type": "enabled",
            "budget_tokens": want["thinking"],
        }


def test_a_policy_output_cap_bounds_what_prepare_step_asks(rt, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        oai.response_stream(oai.call_item("call_1", "ac_lookup", ['{"order_id": "A1"}'])), oai.response_text("done")
    )
    done = _turn(rt, "ac.sampling_openai", policy={"max_output_tokens": 3500})
    assert [b["max_output_tokens"] for b in openai_fake.bodies()] == [3500, 3000]  # 4096 asked, 3000 the agent's
    first, second = done.trace.steps
    assert first.max_output_tokens == 3500
    assert "max_output_tokens 4096 lowered to 3500 by the caller's policy" in first.warnings
    assert first.policy["max_output_tokens"].layer == "caller"
    assert second.max_output_tokens == 3000 and not [w for w in second.warnings if "lowered" in w]


# --------------------------------------------------------------------------- provider fall-through


@pytest.fixture
def only_openai(monkeypatch: pytest.MonkeyPatch, openai_fake: Any) -> Any:  # noqa: F811
    """A deployment with OpenAI's key only: no Anthropic credential, no Gemini one."""
    from tests.test_provider_gemini import _clear_env

    _clear_env(monkeypatch)
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return openai_fake


def test_an_unconfigured_default_falls_through_to_the_next_configured_provider(rt, only_openai):
    only_openai.enqueue(oai.response_text("done"))
    done = _turn(rt, "ac.falls_through")
    assert (done.provider, done.model) == ("openai", "gpt-test")  # Anthropic and Gemini skipped: not configured
    assert done.text == "done" and len(only_openai.bodies()) == 1
    assert done.trace.steps[0].policy["model"].layer == "fall-through"


def test_without_the_flag_an_unconfigured_default_fails_closed(rt, only_openai):
    with pytest.raises(SubmitError) as err:
        create_turn(rt, "ac.fails_closed", prompt="hi")
    assert str(err.value).startswith("provider 'anthropic' is not configured: set ANTHROPIC_API_KEY")
    assert only_openai.bodies() == []


def test_a_provider_the_caller_chose_never_falls_through(rt, only_openai):
    with pytest.raises(SubmitError) as err:
        create_turn(rt, "ac.falls_through", prompt="hi", provider="anthropic", model="claude-test")
    assert "provider 'anthropic' is not configured" in str(err.value)


# --------------------------------------------------------------------------- the repair hook


def _calls(state: Any) -> list[Any]:
    return [p for m in state.messages if m.role == "assistant" for p in m.parts if p.type == "tool-call"]


def test_a_repaired_call_is_what_runs_and_what_is_stored(rt, prefix, openai_fake):  # noqa: F811
    call_id = f"call_{prefix}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item(call_id, "ac_lookup", ['{"order_id": ', '"A1"'])),
        oai.response_text("done"),
    )
    done = _turn(rt, "ac.repairing")
    assert REPAIRS[call_id] == ['the arguments of ac_lookup are not a JSON object: {"order_id": "A1"']  # asked once
    [call] = _calls(done)
    assert (call.id, call.args, call.provider_data) == (call_id, {"order_id": "A1"}, None)  # the transcript's
    [result] = [r for m in done.messages if m.role == "tool" for r in m.results]
    assert result.status == ToolResultStatus.OK and result.output == {"order_id": "A1", "status": "shipped"}
    first = done.trace.steps[0]
    assert first.repaired_calls == [call_id] and not first.malformed  # no corrective retry was needed
    # the model's next request carries the repaired call, as the transcript stores it
    sent = [i for i in openai_fake.bodies()[1]["input"] if i.get("type") == "function_call"]
    assert [json.loads(i["arguments"]) for i in sent] == [{"order_id": "A1"}]


def test_a_hook_that_gives_up_leaves_the_corrective_retry(rt, prefix, openai_fake):  # noqa: F811
    call_id = f"call_{prefix}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item(call_id, "ac_lookup", ['{"order_id": "A1"}}'])),  # not closable
        oai.response_text("done"),
    )
    done = _turn(rt, "ac.repairing")
    assert len(REPAIRS[call_id]) == 1
    first = done.trace.steps[0]
    assert first.malformed and first.repaired_calls == []  # the retry with the adapter's note, as without a hook


@pytest.mark.parametrize(
    ("name", "args", "error"),
    [
        ("ac_lookup", {"id": "A2"}, "invalid arguments for ac_lookup: "),
        ("lookup", {"order_id": "A2"}, "no tool named 'lookup' is available on this step (available: ac_lookup)"),
    ],
    ids=["schema-invalid arguments", "unknown tool name"],
)
def test_the_hook_repairs_refused_arguments_and_tool_names(rt, prefix, openai_fake, name, args, error):  # noqa: F811
    call_id = f"call_{prefix}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item(call_id, name, [json.dumps(args)])),
        oai.response_text("done"),
    )
    done = _turn(rt, "ac.repairing")
    [asked] = REPAIRS[call_id]
    assert asked.startswith(error), asked
    [call] = _calls(done)
    assert (call.id, call.name, call.args) == (call_id, "ac_lookup", {"order_id": "A2"})
    [result] = [r for m in done.messages if m.role == "tool" for r in m.results]
    assert result.status == ToolResultStatus.OK and result.output == {"order_id": "A2", "status": "shipped"}
    assert done.trace.steps[0].repaired_calls == [call_id]


def test_without_a_hook_schema_invalid_arguments_come_back_to_the_model_as_an_error(rt, prefix, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        oai.response_stream(oai.call_item(f"call_{prefix}", "ac_lookup", ['{"id": "A2"}'])),
        oai.response_text("done"),
    )
    done = _turn(rt, "ac.not_repairing")
    [result] = [r for m in done.messages if m.role == "tool" for r in m.results]
    assert result.status != ToolResultStatus.OK and done.trace.steps[0].repaired_calls == []


def test_without_a_hook_a_malformed_call_gets_the_corrective_retry(rt, prefix, openai_fake):  # noqa: F811
    openai_fake.enqueue(
        oai.response_stream(oai.call_item(f"call_{prefix}", "ac_lookup", ['{"order_id": ', '"A1"'])),
        oai.response_text("done"),
    )
    done = _turn(rt, "ac.not_repairing")
    assert done.trace.steps[0].malformed and f"call_{prefix}" not in REPAIRS


# --------------------------------------------------------------------------- deferred tool calls


def _parks(client: Any, turn_id: str, status: TurnStatus) -> Any:
    eventually(lambda: client.get(turn_id).status == status, timeout=120, what=f"the turn to be {status}")
    return client.get(turn_id)


def test_defer_tools_parks_every_call_for_the_caller(worker, client, openai_fake):  # noqa: F811
    order = f"o-{uuid.uuid4().hex[:8]}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item("call_1", "ac_stock", [json.dumps({"order_id": order})])),
        oai.response_text("done"),
    )
    handle = client.submit("ac.deferring", prompt="check", defer_tools=True)
    state = _parks(client, handle.turn_id, TurnStatus.AWAITING_TOOL_RESULTS)
    assert [(c.tool_call_id, c.tool_name, c.args) for c in state.parked.client_calls] == [
        ("call_1", "ac_stock", {"order_id": order})
    ]
    client.resume(handle.turn_id, {"call_1": "the caller's stock answer"})
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert order not in RAN.get("ac_stock", [])  # a server-side tool, never run here
    [sent] = [i for i in openai_fake.bodies()[1]["input"] if i.get("type") == "function_call_output"]
    assert "the caller's stock answer" in sent["output"]


def test_without_defer_tools_the_same_call_runs_here(worker, client, openai_fake):  # noqa: F811
    order = f"o-{uuid.uuid4().hex[:8]}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item("call_1", "ac_stock", [json.dumps({"order_id": order})])),
        oai.response_text("done"),
    )
    result = client.submit("ac.deferring", prompt="check").wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert order in RAN["ac_stock"]


def test_a_deferred_call_that_needs_approval_reaches_the_caller_only_once_approved(worker, client, openai_fake):  # noqa: F811
    order = f"o-{uuid.uuid4().hex[:8]}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item("call_1", "ac_refund", [json.dumps({"order_id": order})])),
        oai.response_text("done"),
    )
    handle = client.submit("ac.deferring", prompt="refund", defer_tools=True)
    state = _parks(client, handle.turn_id, TurnStatus.AWAITING_APPROVAL)
    assert state.parked.client_calls == []  # not the caller's yet
    with pytest.raises(ToolResultsError) as err:  # so a result for it is refused: no way around the reviewer
        client.resume(handle.turn_id, {"call_1": "refunded by the caller"})
    assert err.value.code == ToolResultsRefusal.NOT_WAITING
    [approval] = state.parked.approvals
    assert client.approve(approval.approval_id, True).wait(30)
    state = _parks(client, handle.turn_id, TurnStatus.AWAITING_TOOL_RESULTS)
    assert [(c.tool_call_id, c.args) for c in state.parked.client_calls] == [("call_1", {"order_id": order})]
    client.resume(handle.turn_id, {"call_1": "refunded by the caller"})
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert order not in RAN.get("ac_refund", [])  # the caller ran it, after the approval
    [sent] = [i for i in openai_fake.bodies()[1]["input"] if i.get("type") == "function_call_output"]
    assert "refunded by the caller" in sent["output"]


def test_a_denied_deferred_call_never_reaches_the_caller(worker, client, openai_fake):  # noqa: F811
    order = f"o-{uuid.uuid4().hex[:8]}"
    openai_fake.enqueue(
        oai.response_stream(oai.call_item("call_1", "ac_refund", [json.dumps({"order_id": order})])),
        oai.response_text("done"),
    )
    handle = client.submit("ac.deferring", prompt="refund", defer_tools=True)
    [approval] = _parks(client, handle.turn_id, TurnStatus.AWAITING_APPROVAL).parked.approvals
    assert client.approve(approval.approval_id, False, reason="no").wait(30)
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert order not in RAN.get("ac_refund", [])
    [sent] = [i for i in openai_fake.bodies()[1]["input"] if i.get("type") == "function_call_output"]
    assert "denied by reviewer: no" in sent["output"]


def test_bedrock_batch_bodies_keep_bedrock_s_sampling_and_drop_what_bedrock_has_no_place_for():
    """Claude on Bedrock batch inference takes the Messages body through InvokeModel: temperature and top_p
    go in (the online Anthropic API takes none), effort and strict stay out, as on the Converse path."""
    from stepq.models import ToolSpec, UserMessage
    from stepq.providers.base import StepRequest
    from stepq.providers.bedrock.batch import invoke_body

    spec = ToolSpec(name="ac_lookup", description="d", input_schema={"type": "object"}, strict=True)
    request = StepRequest(
        provider="bedrock",
        model="anthropic.claude-test",
        messages=[UserMessage(content="hi")],
        tools=[spec],
        temperature=0.2,
        top_p=0.7,
        reasoning_effort="low",
    )
    body = invoke_body(request)
    assert (body["temperature"], body["top_p"]) == (0.2, 0.7)
    assert "output_config" not in body and "strict" not in body["tools"][0]


def test_the_http_submit_body_carries_defer_tools(prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepq.fleet.runtime import get_runtime
    from tests.conftest import make_settings
    from tests.gateway_support import api_keys_setting, serve, submit

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-defer")  # ac.deferring's provider is configured
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)
    with serve(settings) as gw, gw.client() as http:
        deferring = submit(http, "ac.deferring", "check", defer_tools=True)
        plain = submit(http, "ac.deferring", "check")
        refused = http.post("/v1/turns", json={"agent": "ac.deferring", "prompt": "x", "defer_tools": "sometimes"})
    assert refused.status_code == 422, refused.text
    turns = get_runtime(settings).turns
    assert turns.load(deferring).defer_tools is True and turns.load(plain).defer_tools is False


def test_the_task_plan_tool_is_never_deferred(worker, client, openai_fake):  # noqa: F811
    order = f"o-{uuid.uuid4().hex[:8]}"
    plan = {"steps": [{"label": "Check the stock", "tool_name": "ac_stock"}]}
    openai_fake.enqueue(
        oai.response_stream(
            oai.call_item("call_p", "update_task_plan", [json.dumps(plan)]),
            oai.call_item("call_s", "ac_stock", [json.dumps({"order_id": order})]),
        ),
        oai.response_text("done"),
    )
    handle = client.submit("ac.planning_deferring", prompt="check", defer_tools=True)
    state = _parks(client, handle.turn_id, TurnStatus.AWAITING_TOOL_RESULTS)
    assert [c.tool_call_id for c in state.parked.client_calls] == ["call_s"]  # the plan is stepq's, not the caller's
    assert [s.label for s in state.plan or []] == ["Check the stock"]
    client.resume(handle.turn_id, {"call_s": "in stock"})
    assert handle.wait(timeout=120).status == TurnStatus.COMPLETED
