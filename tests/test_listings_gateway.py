"""The listing and fork routes over HTTP on a real uvicorn: GET /v1/turns, /v1/approvals, /v1/threads and
POST /v1/turns/{id}/fork, with the gateway's auth (another tenant's items never appear; a missing scope is 403;
bad input a 4xx with a message, never a 500)."""

from __future__ import annotations

import hashlib

import pytest

from stepq.models import TurnStatus
from tests.agents_listings import runs_key
from tests.conftest import eventually, make_settings
from tests.gateway_support import serve, submit

KEYS = {  # plaintext key -> (tenant, subject, scopes)
    "k-acme-all": ("acme", "alice", ["submit", "read", "approve"]),
    "k-acme-read": ("acme", "reader", ["read"]),
    "k-acme-review": ("acme", "rita", ["review"]),
    "k-acme-submit": ("acme", "bot", ["submit"]),
    "k-globex-all": ("globex", "gina", ["submit", "read", "approve"]),
}
ROUTES = ["/v1/turns", "/v1/approvals", "/v1/threads"]


@pytest.fixture
def settings(prefix):
    keys = [
        {"sha256": hashlib.sha256(k.encode()).hexdigest(), "tenant": t, "subject": s, "scopes": scopes}
        for k, (t, s, scopes) in KEYS.items()
    ]
    return make_settings(prefix, api_keys=keys, gateway_rate_limit_rpm=0)


@pytest.fixture
def gw(settings):
    with serve(settings) as served:
        yield served


def _park(http, prefix: str) -> str:
    turn_id = submit(http, "rt.approver", "go", metadata={"prefix": prefix})
    eventually(lambda: http.get(f"/v1/turns/{turn_id}").json()["status"] == "awaiting_approval", what="parking")
    return turn_id


def test_each_tenant_sees_only_its_own_turns_approvals_and_threads(worker, gw, prefix, client):
    with gw.client("k-acme-all") as acme, gw.client("k-globex-all") as globex:
        parked = _park(acme, prefix)
        thread = acme.post("/v1/threads", json={"agent": "rt.basic", "metadata": {"title": "Acme chat"}}).json()
        theirs = submit(globex, "rt.basic", "hi", metadata={"prefix": prefix})
        their_thread = globex.post("/v1/threads", json={"agent": "rt.basic"}).json()
        client.wait(theirs, timeout=60)

        turns = acme.get("/v1/turns").json()
        assert [t["turn_id"] for t in turns["items"]] == [parked] and turns["next_cursor"] is None
        item = turns["items"][0]
        assert set(item) == {
            "turn_id", "agent", "tenant", "thread_id", "batch_id", "status", "step", "created_at", "updated_at",
            "finish_reason", "origin",
        }  # fmt: skip
        assert (item["tenant"], item["status"], item["agent"]) == ("acme", "awaiting_approval", "rt.approver")
        assert [t["turn_id"] for t in globex.get("/v1/turns").json()["items"]] == [theirs]

        [approval] = acme.get("/v1/approvals", params={"state": "pending"}).json()["items"]
        assert set(approval) == {
            "approval_id", "turn_id", "agent", "tenant", "call_id", "tool", "args", "created_at", "expires_at",
            "state", "decision", "decided_by", "decided_at",
        }  # fmt: skip
        assert (approval["turn_id"], approval["tool"], approval["args"]) == (
            parked,
            "rt_side_effect",
            {"label": "gated"},
        )
        assert "token" not in str(approval)
        assert globex.get("/v1/approvals").json()["items"] == []
        assert (
            acme.get("/v1/approvals", params={"turn": parked}).json()["items"][0]["approval_id"]
            == (approval["approval_id"])
        )
        # deciding moves it to the decided listing, with who decided
        assert acme.post(f"/v1/approvals/{approval['approval_id']}", json={"approved": True}).status_code == 200
        client.wait(parked, timeout=60)
        assert acme.get("/v1/approvals").json()["items"] == []
        [decided] = acme.get("/v1/approvals", params={"state": "decided"}).json()["items"]
        assert (decided["decision"], decided["decided_by"], decided["state"]) == ("approved", "alice", "decided")
        assert globex.get("/v1/approvals", params={"state": "decided"}).json()["items"] == []

        threads = acme.get("/v1/threads").json()["items"]
        assert [(t["thread_id"], t["title"], t["tenant"]) for t in threads] == [
            (thread["thread_id"], "Acme chat", "acme")
        ]
        assert [t["thread_id"] for t in globex.get("/v1/threads").json()["items"]] == [their_thread["thread_id"]]

        # forking another tenant's turn is a 404 exactly like an unknown turn
        assert globex.post(f"/v1/turns/{parked}/fork", json={"from_step": 0}).status_code == 404


def test_missing_scope_is_403_on_every_new_route(gw):
    with gw.client("k-acme-review") as reviewer, gw.client("k-acme-read") as reader, gw.client("k-acme-submit") as bot:
        assert reviewer.get("/v1/approvals").status_code == 200  # the reviewer scope: the inbox, nothing else
        for path in ["/v1/turns", "/v1/threads"]:
            response = reviewer.get(path)
            assert response.status_code == 403 and "'read'" in response.json()["error"]["message"], path
            assert bot.get(path).status_code == 403
        denied = reader.get("/v1/approvals")
        assert denied.status_code == 403 and "'review' or 'approve'" in denied.json()["error"]["message"]
        assert reader.post("/v1/turns/turn_x/fork", json={"from_step": 0}).status_code == 403
        assert reviewer.post("/v1/turns/turn_x/fork", json={"from_step": 0}).status_code == 403
    with gw.client(None) as anonymous:
        for path in ROUTES:
            assert anonymous.get(path).status_code == 401


def test_bad_listing_input_is_a_4xx_with_a_message(gw):
    with gw.client("k-acme-all") as acme:
        for params, status, words in [
            ({"status": "stuck"}, 400, "unknown status 'stuck'"),
            ({"cursor": "nonsense"}, 400, "invalid cursor"),
            ({"limit": 0}, 422, "limit"),
            ({"limit": 201}, 422, "limit"),
            ({"since": "yesterday"}, 422, "since"),
        ]:
            response = acme.get("/v1/turns", params=params)
            assert response.status_code == status, (params, response.text)
            assert words in response.text
        assert acme.get("/v1/approvals", params={"state": "maybe"}).status_code == 422
        assert acme.get("/v1/threads", params={"cursor": "x"}).status_code == 400
        missing = acme.post("/v1/turns/turn_" + "0" * 32 + "/fork", json={"from_step": 0})
        assert missing.status_code == 404


def test_pages_over_http_follow_next_cursor(worker, gw, prefix, client):
    with gw.client("k-acme-all") as acme:
        ids = [submit(acme, "rt.basic", str(i), metadata={"prefix": prefix}) for i in range(5)]
        for turn_id in ids:
            client.wait(turn_id, timeout=60)
        seen, cursor = [], None
        while True:
            params = {"limit": 2, "status": "completed", **({"cursor": cursor} if cursor else {})}
            page = acme.get("/v1/turns", params=params).json()
            seen += [t["turn_id"] for t in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == list(reversed(ids))


def test_fork_over_http_reuses_stored_results_and_records_its_origin(worker, gw, prefix, client, rt):
    with gw.client("k-acme-all") as acme:
        original = submit(acme, "ls.fork", "Weather today", metadata={"prefix": prefix})
        assert client.wait(original, timeout=60).text == "Weather today: sunny (run 1)"
        response = acme.post(f"/v1/turns/{original}/fork", json={"from_step": 1, "prompt": "And tomorrow?"})
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["origin"] == {"turn_id": original, "step": 1}
        forked = body["turn_id"]
        result = client.wait(forked, timeout=60)
        # the model saw the stored result of the original's lookup (run 1): the tool did not run again
        assert result.status == TurnStatus.COMPLETED and result.text == "And tomorrow?: sunny (run 1)"
        assert int(rt.redis.get(runs_key(prefix))) == 1
        shown = acme.get(f"/v1/turns/{forked}").json()
        assert shown["origin"] == {"turn_id": original, "step": 1} and shown["metadata"]["tenant"] == "acme"
        listed = acme.get("/v1/turns", params={"agent": "ls.fork"}).json()["items"]
        assert [(t["turn_id"], t["origin"]) for t in listed] == [
            (forked, {"turn_id": original, "step": 1}),
            (original, None),
        ]
        bad = acme.post(f"/v1/turns/{original}/fork", json={"from_step": 7})
        assert bad.status_code == 400 and "from_step must be an integer from 0 to 2" in bad.text
