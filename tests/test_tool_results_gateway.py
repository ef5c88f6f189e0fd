"""Client-side tool results over HTTP (real uvicorn, real worker) and from the CLI; transcripts refused at the door."""

from __future__ import annotations

import json

import pytest

from stepq.models import EventType, TurnStatus
from tests.conftest import eventually, make_settings, settings_env
from tests.gateway_support import api_keys_setting, serve, sse_events, submit
from tests.test_cli import stepq, turn_id_of

WAIT = 120


@pytest.fixture
def gw(prefix):
    with serve(make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)) as served:
        yield served


def _parked_over_http(http, prefix):
    turn_id = submit(http, "ct.browser", "go", metadata={"prefix": prefix})
    with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
        for event in sse_events(response):
            if event.event == EventType.TOOL_RESULTS_REQUEST.value:
                break
    eventually(lambda: http.get(f"/v1/turns/{turn_id}").json()["status"] == "awaiting_tool_results", what="parked")
    return turn_id, event.data["data"]


def test_tool_results_over_http_tenant_checked_and_once_only(worker, gw, prefix):
    with gw.client() as http, gw.client("k-globex-all") as other, gw.client("k-acme-read") as reader:
        turn_id, request = _parked_over_http(http, prefix)
        assert [c["tool_call_id"] for c in request["calls"]] == ["call_0_1", "call_0_2"]
        shown = http.get(f"/v1/turns/{turn_id}").json()
        assert [c["tool"] for c in shown["pending_tool_calls"]] == ["ct_pick_date", "ct_geolocate"]
        body = {"results": {"call_0_1": "2026-12-24", "call_0_2": {"city": "Lyon"}}}
        url = f"/v1/turns/{turn_id}/tool-results"

        assert other.post(url, json=body).status_code == 404  # another tenant's turn: as if unknown
        assert other.post(url, json=body).json()["error"]["code"] == "not-found"
        assert reader.post(url, json=body).status_code == 403  # needs the submit scope
        refused = http.post(url, json={"results": {"call_0_1": "x", "call_7": 1}})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "unknown-call"
        assert "'call_7'" in refused.json()["error"]["message"]
        refused = http.post(url, json={"results": {"call_0_1": "x"}})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "missing-results"
        assert "'call_0_2'" in refused.json()["error"]["message"]
        assert http.post(url, json={"result": {}}).status_code == 422  # malformed body

        accepted = http.post(url, json=body)
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["accepted"] == ["call_0_1", "call_0_2"]
        again = http.post(url, json=body)
        assert again.status_code == 409 and again.json()["error"]["code"] in ("already-answered", "turn-not-waiting")
        eventually(lambda: http.get(f"/v1/turns/{turn_id}").json()["status"] == "completed", WAIT, "completed")
        text = http.get(f"/v1/turns/{turn_id}").json()["result"]["text"]
        assert 'ct_pick_date="2026-12-24",ct_geolocate={"city": "Lyon"}' in text


def test_a_transcript_with_an_open_call_is_a_422_naming_it(worker, gw):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "parts": [{"type": "tool-call", "id": "c1", "name": "rt_echo", "args": {"text": "x"}}]},
        {"role": "user", "content": "and?"},
    ]
    with gw.client() as http:
        refused = http.post("/v1/turns", json={"agent": "eng.simple", "messages": messages})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (
        error["code"] == "invalid-transcript"
        and "messages[1]: tool call 'c1' (rt_echo) has no result" in error["message"]
    )


def test_cli_show_status_and_resume(worker, client, prefix, settings):
    env = settings_env(settings)
    handle = client.submit("ct.browser", prompt="go", metadata={"prefix": prefix})
    eventually(lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_TOOL_RESULTS, WAIT, "parked")
    shown = stepq(env, "show", handle.turn_id, check=0).stdout
    assert "awaiting_tool_results" in shown and "awaiting tool result call_0_1: ct_pick_date" in shown
    assert f"stepq resume {handle.turn_id} --results" in shown
    status = json.loads(stepq(env, "status", "--json", check=0).stdout)
    [parked] = [t for t in status["awaiting_approval"]["turns"] if t["turn_id"] == handle.turn_id]
    assert parked["status"] == "awaiting_tool_results"
    assert [c["tool_call_id"] for c in parked["tool_calls"]] == ["call_0_1", "call_0_2"]

    proc = stepq(env, "resume", handle.turn_id, "--results", '{"call_0_1": "soon"}', check=2)
    assert proc.stderr.startswith("stepq: error: no result for open tool call 'call_0_2'")
    assert proc.stderr.count("\n") == 1
    proc = stepq(
        env, "resume", handle.turn_id, "--results", '{"call_0_1": "soon", "call_0_2": "denied"}', "--error", "call_0_2"
    )
    assert proc.returncode == 0, proc.stderr
    assert turn_id_of(proc.stdout) == handle.turn_id
    result = handle.wait(timeout=WAIT)
    assert 'ct_pick_date="soon",ct_geolocate={"error": "denied", "status": "failed"}' in result.text


def test_cli_run_without_a_terminal_answers_client_calls_as_errors(worker, settings):
    env = settings_env(settings)
    proc = stepq(env, "run", "ct.browser", "plan it", "--json", check=0)
    assert "2 client-side tool call(s) answered as errors: stdin is not a terminal" in proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert "no client to run ct_pick_date: stepq run's stdin is not a terminal" in result["text"]
