"""Issue 27 item 3: an agent's typed `context_schema` for the runtime context its tools receive (validated at
submit: a one-line ContextError, HTTP 422, CLI exit 2), `prepare_step` returning an updated context that is
stored with the turn for the later steps, and `prepare_call` running once per turn before its first step, also
across a redelivered step."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from typing import Any

import pytest

from stepq.engine.runner import StepRunner
from stepq.errors import ContextError
from stepq.fleet.runtime import get_runtime
from stepq.models import ToolResultMessage, TurnState, TurnStatus
from stepq.turns.submit import create_turn
from tests.agents_engine import drive
from tests.agents_tenancy import Account, prepare_calls_key
from tests.conftest import ROOT, make_settings, settings_env
from tests.gateway_support import serve


def _submit(rt: Any, agent: str, prefix: str, context: Any) -> TurnState:
    state, created = create_turn(rt, agent, prompt="who am I?", metadata={"prefix": prefix}, context=context)
    assert created
    return state


def _tool_outputs(state: TurnState) -> list[Any]:
    return [r.output for m in state.messages if isinstance(m, ToolResultMessage) for r in m.results]


def test_tools_read_the_typed_context_and_prepare_step_updates_it_for_later_steps(rt, prefix):
    state = drive(rt, _submit(rt, "ten.ctx", prefix, {"account_id": "acct-7"}).turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    # prepare_call set unit=kelvin before step 0; prepare_step made the plan pro from step 1 on
    assert _tool_outputs(state) == [
        {"account": "acct-7", "plan": "free", "unit": "kelvin"},
        {"account": "acct-7", "plan": "pro", "unit": "kelvin"},
    ]
    assert state.context == {"account_id": "acct-7", "plan": "pro", "unit": "kelvin"}  # persisted with the turn
    assert state.text == "system: You look accounts up.\n\nYou act for account acct-7."  # prepare_call's text
    assert int(rt.redis.get(prepare_calls_key(prefix, state.turn_id))) == 1
    assert "acct-7" not in json.dumps([m.model_dump(mode="json") for m in state.messages[:1]])  # not in the prompt


def test_submit_refuses_a_context_that_does_not_match_the_schema_in_one_line(rt, prefix):
    with pytest.raises(ContextError) as caught:
        _submit(rt, "ten.ctx", prefix, {"plan": "pro"})
    assert str(caught.value) == "context does not match agent ten.ctx's context_schema: Field required at account_id"
    with pytest.raises(ContextError, match=r"^context must be a JSON object, not list$"):
        _submit(rt, "ten.ctx", prefix, ["acct-7"])
    assert _submit(rt, "ten.ctx", prefix, Account(account_id="a1")).context == {  # an instance works too
        "account_id": "a1",
        "plan": "free",
        "unit": "celsius",
    }


def test_prepare_call_runs_once_per_turn_even_when_the_first_step_is_redelivered(rt, prefix):
    turn_id = _submit(rt, "ten.ctx_flaky", prefix, {"account_id": "acct-1"}).turn_id
    runner = StepRunner(rt)
    first = runner.deliver(turn_id, 0)
    assert first.action == "retry", first  # the model call failed after prepare_call ran and was committed
    state = rt.turns.load(turn_id)
    assert state is not None and state.call_prepared and state.context is not None
    assert state.context["unit"] == "kelvin"
    done = drive(rt, turn_id)
    assert done.status == TurnStatus.COMPLETED and done.text == "after a retry", done.error
    assert int(rt.redis.get(prepare_calls_key(prefix, turn_id))) == 1


def test_the_gateway_answers_422_naming_the_field(prefix):
    key = {"sha256": hashlib.sha256(b"k-ctx").hexdigest(), "tenant": "acme", "subject": "bot"}
    settings = make_settings(prefix, api_keys=[key], gateway_rate_limit_rpm=0)
    with serve(settings) as gw, gw.client("k-ctx") as http:
        bad = http.post("/v1/turns", json={"agent": "ten.ctx", "prompt": "hi", "context": {"account_id": ""}})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"] == {
            "code": "invalid-context",
            "message": "context does not match agent ten.ctx's context_schema: String should have at least 1 "
            "character at account_id",
        }
        good = http.post("/v1/turns", json={"agent": "ten.ctx", "prompt": "hi", "context": {"account_id": "a9"}})
        assert good.status_code == 201, good.text
    stored = get_runtime(settings).turns.load(good.json()["turn_id"])
    assert stored is not None and stored.context == {"account_id": "a9", "plan": "free", "unit": "celsius"}


def test_the_cli_refuses_a_bad_context_with_one_line_and_exit_2(settings):
    done = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "run", "ten.ctx", "hi", "--context", '{"plan": 3}'],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "context_schema: Field required at account_id" in done.stderr
    assert "Traceback" not in done.stderr


def test_each_turn_of_a_thread_carries_its_own_context(client, rt, prefix):
    """`continue_thread(context=...)`: the turn's tools see that context; the next turn has its own; a bad
    one is refused in one line and stores nothing (the thread is not left busy)."""
    thread = client.create_thread("ten.ctx", metadata={"prefix": prefix})
    first = drive(rt, client.continue_thread(thread.thread_id, prompt="who?", context={"account_id": "t-1"}).turn_id)
    assert first.status == TurnStatus.COMPLETED, first.error
    assert [o["account"] for o in _tool_outputs(first)] == ["t-1", "t-1"]
    with pytest.raises(ContextError, match=r"^context does not match agent ten.ctx's context_schema: Field required"):
        client.continue_thread(thread.thread_id, prompt="again", context={"plan": "pro"})
    second = drive(rt, client.continue_thread(thread.thread_id, prompt="again", context={"account_id": "t-2"}).turn_id)
    assert second.status == TurnStatus.COMPLETED, second.error
    assert second.context is not None and second.context["account_id"] == "t-2"
    assert [o["account"] for o in _tool_outputs(second)][-2:] == ["t-2", "t-2"]


def test_thread_turns_and_the_chat_endpoint_take_a_context_over_http(prefix):
    """`POST /v1/threads/{id}/turns` and `POST /v1/chat` (useChat's `body: {context}`) pass the context on:
    refused with 422 naming the field, else the turn's tools read it (the chat turn runs in-process here)."""
    key = {"sha256": hashlib.sha256(b"k-ctx2").hexdigest(), "tenant": "acme", "subject": "bot"}
    settings = make_settings(prefix, api_keys=[key], gateway_rate_limit_rpm=0)
    rt = get_runtime(settings)
    with serve(settings) as gw, gw.client("k-ctx2") as http:
        thread_id = http.post("/v1/threads", json={"agent": "ten.ctx"}).json()["thread_id"]
        bad = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "hi", "context": {"account_id": ""}})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["code"] == "invalid-context"
        good = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "hi", "context": {"account_id": "h-1"}})
        assert good.status_code == 201, good.text
        stored = rt.turns.load(good.json()["turn_id"])
        assert stored is not None and stored.context == {"account_id": "h-1", "plan": "free", "unit": "celsius"}

        message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "who am I?"}]}
        body: dict[str, Any] = {"id": "ctx-chat", "messages": [message], "agent": "ten.ctx"}
        refused = http.post("/v1/chat", json={**body, "context": {"plan": "pro"}})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "invalid-context"
        with http.stream("POST", "/v1/chat", json={**body, "context": {"account_id": "c-9"}}) as response:
            assert response.status_code == 200, response.read()
            lines = response.iter_lines()
            start = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
            assert start["type"] == "start"
            done = drive(rt, start["messageId"])  # the worker's part, in this process
            assert done.status == TurnStatus.COMPLETED, done.error
            chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    outputs = [c["output"] for c in chunks if c["type"] == "tool-output-available"]
    assert [o["account"] for o in outputs] == ["c-9", "c-9"]
