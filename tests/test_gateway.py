"""The HTTP gateway end to end: real uvicorn, real Redis, a real Celery worker, httpx as the client."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import httpx
import pytest

from stepq.engine.runner import StepRunner
from stepq.errors import ConfigurationError
from stepq.models import EventType
from stepq.producer.gateway.app import create_app
from stepq.producer.gateway.auth import AuthConfig
from stepq.producer.gateway.routes_turns import describe
from stepq.turns.submit import create_turn
from tests.conftest import ROOT, make_settings, settings_env
from tests.gateway_support import TIMEOUT, api_keys_setting, serve, sse_events, submit


@pytest.fixture
def gw_settings(prefix):
    return make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)


@pytest.fixture
def gw(gw_settings):
    with serve(gw_settings) as served:
        yield served


def _stream(http: httpx.Client, turn_id: str, headers: dict[str, str] | None = None, **params):
    with http.stream("GET", f"/v1/turns/{turn_id}/events", headers=headers, params=params) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(response))


def test_submit_stream_and_read_a_turn(worker, gw, rt, prefix):
    with gw.client() as http:
        response = http.post("/v1/turns", json={"agent": "rt.basic", "prompt": "hi", "metadata": {"prefix": prefix}})
        assert response.status_code == 201, response.text
        body = response.json()
        # the turn as it stood when the answer was written: a worker may already have started or finished it
        assert body["status"] in ("queued", "running", "completed") and body["created"] is True
        assert body["events_url"] == f"/v1/turns/{body['turn_id']}/events"
        events = _stream(http, body["turn_id"])
        turn = http.get(f"/v1/turns/{body['turn_id']}").json()
    logged = rt.events.read(body["turn_id"])
    assert [e.id for e in events] == [e.seq for e in logged] == list(range(1, len(logged) + 1))
    assert [e.event for e in events] == [e.type.value for e in logged]
    assert events[-1].event == EventType.TURN_FINISH and events[-1].data["seq"] == events[-1].id
    assert turn["status"] == "completed" and turn["result"]["text"] == "all done here, thanks"
    assert turn["metadata"]["tenant"] == "acme" and turn["usage"]["input_tokens"] > 0
    assert '"token"' not in json.dumps(turn) and "idempotency_key" not in turn


def test_submit_is_validated_like_the_client(gw, client):
    with pytest.raises(Exception) as unknown:
        client.submit("no.such", prompt="hi")
    with gw.client() as http:
        cases = [
            ({"agent": "no.such", "prompt": "hi"}, 400, "unknown-agent"),
            ({"agent": "rt.basic"}, 400, "submit"),
            ({"agent": "rt.basic", "prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, 400, "submit"),
            ({"agent": "rt.basic", "prompt": "   "}, 400, "submit"),
            ({"agent": "rt.basic", "messages": [{"role": "system", "content": "x"}]}, 400, "submit"),
            ({"agent": "rt.basic", "prompt": "hi", "loop": {"max_steps": 10_000}}, 400, "override"),
            ({"agent": "rt.basic", "prompt": "hi", "metadata": {"tenant": "globex"}}, 400, "bad-request"),
            ({"agent": "rt.basic", "prompt": "hi", "surprise": 1}, 422, "invalid-request"),
            ({"agent": 7, "prompt": "hi"}, 422, "invalid-request"),
            ({"agent": "rt.basic", "prompt": "hi", "idempotency_key": ""}, 400, "submit"),
        ]
        for payload, status, code in cases:
            response = http.post("/v1/turns", json=payload)
            assert response.status_code == status, (payload, response.text)
            assert response.json()["error"]["code"] == code, (payload, response.text)
        first = http.post("/v1/turns", json={"agent": "no.such", "prompt": "hi"}).json()["error"]["message"]
        assert first == str(unknown.value)  # the same words as Client.submit
        broken = http.post("/v1/turns", content=b"{not json", headers={"content-type": "application/json"})
        assert broken.status_code == 422 and broken.json()["error"]["code"] == "invalid-request"
        mismatch = http.post(
            "/v1/turns",
            json={"agent": "rt.basic", "prompt": "hi", "idempotency_key": "a"},
            headers={"Idempotency-Key": "b"},
        )
        assert mismatch.status_code == 400


def test_body_over_the_limit_is_413(prefix):
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_max_body_bytes=2000)
    with serve(settings) as gw, gw.client() as http:
        big = http.post("/v1/turns", json={"agent": "rt.basic", "prompt": "x" * 5000})
        assert big.status_code == 413 and big.json()["error"]["code"] == "too-large"

        def chunks():  # no Content-Length: the limit is enforced while the body is read
            yield b'{"agent": "rt.basic", "prompt": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        streamed = http.post("/v1/turns", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "too-large"


def test_idempotency_key_header_returns_the_same_turn_within_a_tenant_only(gw, rt):
    with gw.client() as acme, gw.client("k-globex-all") as globex:
        payload = {"agent": "rt.basic", "prompt": "hi"}
        first = acme.post("/v1/turns", json=payload, headers={"Idempotency-Key": "order-7"})
        again = acme.post("/v1/turns", json=payload, headers={"Idempotency-Key": "order-7"})
        other = globex.post("/v1/turns", json=payload, headers={"Idempotency-Key": "order-7"})
        in_body = acme.post("/v1/turns", json={**payload, "idempotency_key": "order-7"})
    assert first.status_code == 201 and again.status_code == 200 and in_body.status_code == 200
    assert first.json()["turn_id"] == again.json()["turn_id"] == in_body.json()["turn_id"]
    assert other.status_code == 201 and other.json()["turn_id"] != first.json()["turn_id"]
    assert rt.turns.load(other.json()["turn_id"]).metadata["tenant"] == "globex"


def test_unknown_routes_wrong_methods_and_ids_answer_json(gw):
    with gw.client() as http:
        for method, path, status in [
            ("GET", "/v1/nothing-here", 404),
            ("DELETE", "/v1/turns", 405),
            ("GET", "/v1/turns/turn_doesnotexist", 404),
            ("GET", "/v1/turns/turn_doesnotexist/events", 404),
            ("POST", "/v1/turns/turn_doesnotexist/cancel", 404),
        ]:
            response = http.request(method, path)
            assert response.status_code == status, (method, path, response.text)
            error = response.json()["error"]
            assert error["code"] and error["message"] and "Traceback" not in response.text


def test_a_turn_that_ended_streams_whole_and_a_cursor_resumes(worker, gw, prefix):
    with gw.client() as http:
        turn_id = submit(http, "rt.basic", "hi", metadata={"prefix": prefix})
        full = _stream(http, turn_id)  # follows it live to the end
        again = _stream(http, turn_id)  # connects after it ended: the whole stream, then the end
        assert [(e.id, e.event) for e in again] == [(e.id, e.event) for e in full]
        assert full[-1].event == "turn-finish"
        middle = full[len(full) // 2].id
        by_header = _stream(http, turn_id, headers={"Last-Event-ID": str(middle)})
        by_query = _stream(http, turn_id, after=str(middle))
        assert [e.id for e in by_header] == [e.id for e in by_query] == [e.id for e in full if e.id > middle]
        assert _stream(http, turn_id, after=str(full[-1].id)) == []  # at the end: nothing, and the stream ends
        for bad in ["-1", "abc", "1.5", str(full[-1].id + 1)]:
            response = http.get(f"/v1/turns/{turn_id}/events", params={"after": bad})
            assert response.status_code == 400 and response.json()["error"]["code"] == "invalid-cursor", bad
            response = http.get(f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": bad})
            assert response.status_code == 400, bad


def _events_until(response: httpx.Response, kind: str) -> list:
    seen = []
    for event in sse_events(response):
        seen.append(event)
        if event.event == kind:
            return seen
    raise AssertionError(f"the stream ended without {kind}")


def test_reconnect_with_last_event_id_sees_every_event_once_and_approve_as_principal(worker, gw, rt, prefix):
    with gw.client() as http, gw.client("k-acme-read") as reader, gw.client("k-globex-all") as globex:
        turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
            first = _events_until(response, "approval-request")  # then hang up mid-turn
        request = first[-1].data["data"]
        assert "token" not in request and '"token"' not in json.dumps(first[-1].data)
        approval_id = request["approval_id"]
        assert request["tool"] == "rt_side_effect" and request["expires_at"] > 0
        assert http.get(f"/v1/turns/{turn_id}").json()["pending_approvals"][0]["approval_id"] == approval_id

        denied = reader.post(f"/v1/approvals/{approval_id}", json={"approved": True})
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
        hidden = globex.post(f"/v1/approvals/{approval_id}", json={"approved": True})
        assert hidden.status_code == 404
        assert rt.approvals.get(approval_id).status == "pending"
        assert http.post(f"/v1/approvals/{approval_id}", json={"yes": True}).status_code == 422

        decided = http.post(f"/v1/approvals/{approval_id}", json={"approved": True, "reason": "fine"})
        assert decided.status_code == 200, decided.text
        assert decided.json()["decision"] == "approved" and decided.json()["reviewer"] == "alice"
        twice = http.post(f"/v1/approvals/{approval_id}", json={"approved": False})
        assert twice.status_code == 409 and twice.json()["error"]["code"] == "not-pending"
        rest = _stream(http, turn_id, headers={"Last-Event-ID": str(first[-1].id)})
    seen = first + rest
    logged = rt.events.read(turn_id)
    assert [e.id for e in seen] == [e.seq for e in logged] == list(range(1, len(logged) + 1))
    assert seen[-1].event == "turn-finish"
    decision = next(e for e in seen if e.event == "approval-decision")
    assert decision.data["data"]["reviewer"] == "alice" and decision.data["data"]["decision"] == "approved"
    assert rt.approvals.get(approval_id).reviewer == "alice"


def test_a_parked_turn_shows_the_reviewer_each_pending_calls_tool_arguments_and_expiry(worker, gw, rt, prefix):
    """GET /v1/turns/{id} and Client.get carry what a reviewer decides on, as the approval request showed it;
    never the token."""
    with gw.client() as http:
        turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
            request = _events_until(response, "approval-request")[-1].data["data"]
        turn = http.get(f"/v1/turns/{turn_id}").json()
    assert turn["status"] == "awaiting_approval"
    assert turn["pending_approvals"] == [
        {
            "approval_id": request["approval_id"],
            "tool_call_id": request["tool_call_id"],
            "tool": "rt_side_effect",
            "args": {"label": "gated"},
            "expires_at": request["expires_at"],
        }
    ]
    token = rt.approvals.get(request["approval_id"]).token
    assert token and token not in json.dumps(turn) and token.split(".")[1] not in json.dumps(turn)
    [parked] = rt.turns.load(turn_id).parked.approvals  # what Client.get returns
    assert parked.args == request["args"] == {"label": "gated"} and parked.expires_at == request["expires_at"]


def test_a_step_parked_by_an_older_worker_shows_the_calls_own_arguments(rt, prefix):
    """Approvals parked before they kept their arguments: GET shows the parked call's arguments instead."""
    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix})
    StepRunner(rt).deliver(state.turn_id, 0)
    parked = rt.turns.load(state.turn_id)
    for approval in parked.parked.approvals:
        approval.args = None
    [shown] = describe(parked)["pending_approvals"]
    assert shown["tool"] == "rt_side_effect" and shown["args"] == {"label": "gated"}


def test_deny_through_the_gateway_becomes_the_tool_result(worker, gw, rt, prefix):
    with gw.client() as http:
        turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
            approval_id = _events_until(response, "approval-request")[-1].data["data"]["approval_id"]
        response = http.post(f"/v1/approvals/{approval_id}", json={"approved": False, "reason": "too risky"})
        assert response.status_code == 200 and response.json()["decision"] == "denied"
        events = _stream(http, turn_id)
        assert events[-1].event == "turn-finish"
        turn = http.get(f"/v1/turns/{turn_id}").json()
    assert turn["status"] == "completed"
    results = [e.data["data"] for e in events if e.event == "tool-result"]
    assert any("denied by reviewer: too risky" in json.dumps(r) for r in results)
    unknown = gw.client().post("/v1/approvals/apv_nothing", json={"approved": True})
    assert unknown.status_code == 404


def test_cancel_a_parked_turn(worker, gw, rt, prefix):
    with gw.client() as http, gw.client("k-globex-all") as globex, gw.client("k-acme-read") as reader:
        turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
            _events_until(response, "approval-request")
        assert globex.post(f"/v1/turns/{turn_id}/cancel").status_code == 404
        assert reader.post(f"/v1/turns/{turn_id}/cancel").status_code == 403
        response = http.post(f"/v1/turns/{turn_id}/cancel")
        assert response.status_code == 202 and response.json()["cancel_requested"] is True
        events = _stream(http, turn_id)
        assert events[-1].event == "turn-finish"
        assert http.get(f"/v1/turns/{turn_id}").json()["status"] == "cancelled"


def test_a_quiet_stream_gets_keep_alive_comments(worker, prefix):
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_keepalive_s=0.2)
    with serve(settings) as gw, gw.client() as http:
        turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
            lines = response.iter_lines()
            assert any(line == "event: approval-request" for line in lines)
            # parked: nothing more happens, yet the stream must show it is alive (a silent stream would end
            # this test with httpx's read timeout instead)
            assert any(line == ": keep-alive" for line in lines)


def test_agents_health_ready_and_metrics(worker, gw, prefix):
    with gw.client() as http:
        agents = {a["id"]: a for a in http.get("/v1/agents").json()["agents"]}
        assert agents["demo.support"]["tools"] == ["lookup_order", "issue_refund"]
        assert agents["demo.support"]["approvals_possible"] is True
        assert agents["demo.support"]["suggestions"][1] == {
            "label": "Where is order A-1002?",
            "prompt": "Where is order A-1002?",
        }
        assert agents["demo.extractor"]["execution_mode"] == "object"
        assert agents["rt.approver"]["approvals_possible"] is True
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ready"}
        turn_id = submit(http, "rt.basic", "hi", metadata={"prefix": prefix})
        _stream(http, turn_id)
        http.get("/v1/turns/turn_nope")
        text = http.get("/metrics").text
        assert http.get("/openapi.json").json()["paths"]["/v1/turns"]["post"]
    assert 'stepq_gateway_requests_total{method="POST",route="/v1/turns",status="201"} 1.0' in text
    assert 'route="/v1/turns/{turn_id}",status="404"' in text
    assert "stepq_gateway_open_streams 0.0" in text
    assert "stepq_gateway_stream_duration_seconds_count 1.0" in text


def test_readyz_is_503_when_redis_is_unreachable(prefix):
    settings = make_settings(prefix, redis_url="redis://127.0.0.1:1/0", api_keys=api_keys_setting())
    with serve(settings) as gw, gw.client() as http:
        response = http.get("/readyz")
        assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"
        assert http.get("/healthz").status_code == 200


def test_per_credential_rate_limit_is_429(prefix):
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=3)
    with serve(settings) as gw, gw.client() as http, gw.client("k-globex-all") as other:
        answers = [http.get("/v1/agents").status_code for _ in range(4)]
        limited = http.get("/v1/agents")
        assert answers[:3] == [200, 200, 200] and answers[3] == 429
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["error"]["code"] == "rate-limited"
        assert other.get("/v1/agents").status_code == 200  # another credential has its own budget


def test_no_auth_configured_refuses_to_start_unless_insecure_dev(prefix, tmp_path):
    settings = make_settings(prefix)
    with pytest.raises(ConfigurationError, match="--insecure-dev"):
        create_app(settings, AuthConfig.from_settings(settings))
    env = settings_env(settings)
    env.pop("STEPQ_API_KEYS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "serve", "--port", "0"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 2 and "--insecure-dev" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    with serve(settings, AuthConfig.from_settings(settings, insecure_dev=True)) as gw, gw.client(None) as http:
        assert http.get("/v1/agents").status_code == 200  # every request is the `dev` principal


def test_bad_api_keys_setting_is_a_one_line_error(prefix):
    settings = make_settings(prefix, api_keys=[{"sha256": "short", "tenant": "a", "subject": "b"}])
    with pytest.raises(ConfigurationError, match="STEPQ_API_KEYS entry 0"):
        AuthConfig.from_settings(settings)


def test_one_pubsub_connection_serves_many_streams(worker, gw, rt, prefix):
    """Twenty streams of twenty parked turns: the gateway's Redis connections do not grow with them."""
    from stepq.producer.gateway.service import client_name

    def gateway_connections() -> int:
        listing = rt.redis.client_list()
        return sum(1 for c in listing if c.get("name") == client_name(gw.settings))

    with gw.client() as http:
        turns = [submit(http, "rt.approver", "go", metadata={"prefix": prefix}) for _ in range(20)]
        readers = []
        with contextlib.ExitStack() as open_streams:
            for index, turn_id in enumerate(turns):
                response = open_streams.enter_context(http.stream("GET", f"/v1/turns/{turn_id}/events"))
                lines = response.iter_lines()  # kept: closing this iterator would close the response
                readers.append(lines)
                assert any(line == "event: approval-request" for line in lines)
                if index == 1:
                    with_two = gateway_connections()
            with_twenty = gateway_connections()
            subscribed = [c for c in rt.redis.client_list() if c.get("name") == client_name(gw.settings)]
            pubsub_conns = [c for c in subscribed if int(c.get("sub", 0)) > 0]
            assert len(pubsub_conns) == 1 and int(pubsub_conns[0]["sub"]) == 20
            metrics = http.get("/metrics").text
            assert "stepq_gateway_open_streams 20.0" in metrics
            assert "stepq_gateway_subscribed_channels 20.0" in metrics
    assert with_two >= 1 and with_twenty < len(turns)  # a connection per stream would be 20 and more


def test_a_stream_survives_redis_dropping_the_gateways_connections(worker, gw, rt, prefix):
    """CLIENT KILL every connection the gateway holds mid-stream: the open stream reconnects and still
    delivers every event once, in order, to the end."""
    from stepq.producer.gateway.service import client_name

    with gw.client() as http:
        turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
            events = sse_events(response)
            seen = []
            for event in events:
                seen.append(event)
                if event.event == "approval-request":
                    break
            killed = sum(
                rt.redis.client_kill_filter(_id=c["id"])
                for c in rt.redis.client_list()
                if c.get("name") == client_name(gw.settings)
            )
            assert killed >= 1
            approval_id = seen[-1].data["data"]["approval_id"]
            decided = http.post(f"/v1/approvals/{approval_id}", json={"approved": True})
            assert decided.status_code == 200, decided.text
            seen += list(events)
    logged = rt.events.read(turn_id)
    assert [e.id for e in seen] == [e.seq for e in logged] == list(range(1, len(logged) + 1))
    assert seen[-1].event == "turn-finish"


def test_redis_unreachable_is_503_json_not_500(prefix):
    settings = make_settings(
        prefix,
        redis_url="redis://127.0.0.1:1/0",
        api_keys=api_keys_setting(),
        gateway_rate_limit_rpm=0,
        redis_outage_s=1,  # how long the library's sync calls wait for Redis to come back
    )
    with serve(settings) as gw, gw.client() as http:
        for path in ["/v1/turns/turn_x", "/v1/turns/turn_x/events"]:
            response = http.get(path)
            assert response.status_code == 503, (path, response.text)
            assert response.json()["error"]["code"] == "unavailable"


def test_cors_origins_are_configurable(prefix):
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_cors_origins=["https://chat.example"])
    with serve(settings) as gw, gw.client(None) as http:
        preflight = {"Origin": "https://chat.example", "Access-Control-Request-Method": "POST"}
        allowed = http.options("/v1/turns", headers=preflight)
        assert allowed.headers.get("access-control-allow-origin") == "https://chat.example"
        other = http.options("/v1/turns", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_serve_insecure_dev_says_so_and_loads_the_demo_agents(prefix):
    import socket

    settings = make_settings(prefix, agent_modules=[])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepq.producer.cli", "serve", "--insecure-dev", "--port", str(port)],
        env=settings_env(settings), cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
            agents = [a["id"] for a in http.get("/v1/agents").json()["agents"]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = "".join(said)
    assert "INSECURE DEV MODE" in text and "demo agents" in text, text
    assert agents == ["demo.enricher", "demo.extractor", "demo.planner", "demo.storyteller", "demo.support"]


def test_a_command_on_a_connection_redis_dropped_is_retried_on_a_new_one(prefix, rt):
    """Redis closes the gateway's pooled connection (CLIENT KILL, a restart, an idle timeout) and the next
    command comes before the event loop has seen the close: it is retried on a fresh connection instead of
    failing the request with a 503 (seen under load as a refused approval right after a drop)."""
    import asyncio

    from stepq.producer.gateway.service import Gateway, client_name

    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)
    gw = Gateway(settings)
    rt.redis.set(f"{prefix}:probe", "here")

    async def drop_then_read() -> str | None:
        assert await gw.redis.ping()
        # blocking the loop: it cannot see the close before the next command goes out on that connection
        killed = sum(
            rt.redis.client_kill_filter(_id=c["id"])
            for c in rt.redis.client_list()
            if c.get("name") == client_name(gw.settings)
        )
        assert killed == 1
        value = await gw.redis.get(f"{prefix}:probe")
        await gw.redis.aclose()
        return value if isinstance(value, str) else None

    assert asyncio.run(drop_then_read()) == "here"
