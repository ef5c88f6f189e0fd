"""Who may do what through the gateway: API keys, HS256 and RS256 (JWKS file) JWTs, tenants and scopes."""

from __future__ import annotations

import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.conftest import make_settings
from tests.gateway_support import JWT_SECRET, TIMEOUT, api_keys_setting, hs256, rs256, serve, submit, write_jwks


@pytest.fixture
def gw(prefix, tmp_path):
    settings = make_settings(
        prefix,
        api_keys=api_keys_setting(),
        jwt_secret=JWT_SECRET,
        jwt_jwks_file=write_jwks(tmp_path / "jwks.json"),
        gateway_rate_limit_rpm=0,
    )
    with serve(settings) as served:
        yield served


def _get(gw, path: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(gw.url + path, headers=headers, timeout=TIMEOUT)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_missing_or_unknown_credentials_are_401(gw):
    for headers in [{}, _bearer("not-a-key"), {"X-API-Key": "wrong"}, {"Authorization": "Basic abc"}]:
        response = _get(gw, "/v1/agents", headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "unauthenticated"
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert _get(gw, "/v1/agents", {"X-API-Key": "k-acme-all"}).status_code == 200
    assert _get(gw, "/v1/agents", _bearer("k-acme-all")).status_code == 200
    assert _get(gw, "/healthz", {}).status_code == 200  # probes need no credentials


def test_another_tenants_turn_is_404_like_an_unknown_one(worker, gw, prefix):
    with gw.client() as acme, gw.client("k-globex-all") as globex:
        turn_id = submit(acme, "rt.basic", "hi", metadata={"prefix": prefix})
        for path in [f"/v1/turns/{turn_id}", f"/v1/turns/{turn_id}/events"]:
            theirs = globex.get(path)
            missing = globex.get(path.replace(turn_id, "turn_" + "0" * 32))
            assert theirs.status_code == missing.status_code == 404, path
            # the same answer, word for word, as for an id that never existed
            assert theirs.json()["error"]["message"].replace(turn_id, "X") == missing.json()["error"][
                "message"
            ].replace("turn_" + "0" * 32, "X")
        assert globex.post(f"/v1/turns/{turn_id}/cancel").status_code == 404
        assert acme.get(f"/v1/turns/{turn_id}").status_code == 200
        jwt_same_tenant = httpx.get(f"{gw.url}/v1/turns/{turn_id}", headers=_bearer(hs256("acme", "u1", "read")))
        assert jwt_same_tenant.status_code == 200


def test_missing_scope_is_403(gw):
    with gw.client("k-acme-read") as reader, gw.client("k-acme-submit") as bot:
        response = reader.post("/v1/turns", json={"agent": "rt.basic", "prompt": "hi"})
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
        assert "'submit'" in response.json()["error"]["message"]
        assert reader.get("/v1/agents").status_code == 200
        assert bot.post("/v1/approvals/apv_x", json={"approved": True}).status_code == 403
    no_scopes = hs256("acme", "u2", "")
    assert _get(gw, "/v1/agents", _bearer(no_scopes)).status_code == 403


def test_hs256_jwt_maps_to_a_principal_and_expired_is_401(gw):
    ok = httpx.post(
        f"{gw.url}/v1/turns",
        json={"agent": "rt.basic", "prompt": "hi"},
        headers=_bearer(hs256("initech", "peter", "submit read")),
        timeout=TIMEOUT,
    )
    assert ok.status_code == 201
    turn_id = ok.json()["turn_id"]
    mine = _get(gw, f"/v1/turns/{turn_id}", _bearer(hs256("initech", "someone-else", "read")))
    assert mine.status_code == 200 and mine.json()["metadata"]["tenant"] == "initech"
    assert _get(gw, f"/v1/turns/{turn_id}", {"X-API-Key": "k-acme-all"}).status_code == 404

    expired = _get(gw, "/v1/agents", _bearer(hs256("initech", "peter", "read", exp_in=-60)))
    assert expired.status_code == 401 and "expired" in expired.json()["error"]["message"]
    forged = jwt.encode(
        {"sub": "p", "tenant": "initech", "scope": "read", "exp": int(time.time()) + 60}, "x" * 32, algorithm="HS256"
    )
    assert _get(gw, "/v1/agents", _bearer(forged)).status_code == 401
    no_tenant = jwt.encode({"sub": "p", "scope": "read", "exp": int(time.time()) + 60}, JWT_SECRET, algorithm="HS256")
    response = _get(gw, "/v1/agents", _bearer(no_tenant))
    assert response.status_code == 401 and "tenant" in response.json()["error"]["message"]
    unsigned = jwt.encode(
        {"sub": "p", "tenant": "initech", "scope": "read", "exp": int(time.time()) + 60}, None, "none"
    )
    assert _get(gw, "/v1/agents", _bearer(unsigned)).status_code == 401


def test_rs256_jwt_verified_with_the_jwks_file(gw):
    assert _get(gw, "/v1/agents", _bearer(rs256("hooli", "gavin", "read"))).status_code == 200
    assert _get(gw, "/v1/agents", _bearer(rs256("hooli", "gavin", "read", exp_in=-5))).status_code == 401
    unknown_kid = _get(gw, "/v1/agents", _bearer(rs256("hooli", "gavin", "read", kid="other")))
    assert unknown_kid.status_code == 401 and "other" in unknown_kid.json()["error"]["message"]
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"sub": "g", "tenant": "hooli", "scope": "read", "exp": int(time.time()) + 60}
    foreign = jwt.encode(claims, stranger, algorithm="RS256", headers={"kid": "test-rsa"})
    assert _get(gw, "/v1/agents", _bearer(foreign)).status_code == 401
