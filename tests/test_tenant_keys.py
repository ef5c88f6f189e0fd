"""Issue 27 item 2, keys: a tenant's own provider API key, stored encrypted in Redis (or as a reference to a
worker-held secret), sent on that tenant's steps only, rotated without a restart, never in Redis in clear, in
events or in logs. Real Anthropic SDK against the local wire fake, which records which key each call carried
(a hash of it)."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from cryptography.fernet import Fernet

from stepq.config.settings import Settings
from stepq.engine.runner import StepRunner
from stepq.fleet.runtime import get_runtime
from stepq.models import TurnState, TurnStatus
from stepq.store.credentials import reference, seal
from stepq.turns.submit import create_turn
from tests.agents_engine import drive
from tests.conftest import REDIS_URL, ROOT, make_settings, settings_env
from tests.fakes.anthropic_server import FakeAnthropic, stream, text_block, text_reply, tool_use_block

FLEET_KEY = "sk-ant-fleet-" + uuid.uuid4().hex
ACME_KEY = "sk-ant-acme-" + uuid.uuid4().hex
GLOBEX_KEY = "sk-ant-globex-" + uuid.uuid4().hex


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", FLEET_KEY)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield server
    server.stop()


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, credentials_key=Fernet.generate_key().decode())


def _submit(rt: Any, tenant: str | None, prompt: str) -> TurnState:
    metadata = {"tenant": tenant} if tenant else {}
    state, created = create_turn(rt, "ten.claude", prompt=prompt, metadata=metadata)
    assert created
    return state


def _cli(settings: Settings, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", "tenant-key", *args],
        env={**settings_env(settings), **(env or {})},
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _everything_in_redis(prefix: str) -> str:
    """Every value stored under the test's prefix, as text (strings, hashes, lists, sets, streams)."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    parts: list[str] = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        kind = client.type(key)
        if kind == "string":
            parts.append(str(client.get(key)))
        elif kind == "hash":
            parts.append(str(client.hgetall(key)))
        elif kind == "list":
            parts.append(str(client.lrange(key, 0, -1)))
        elif kind == "set":
            parts.append(str(client.smembers(key)))
        elif kind == "zset":
            parts.append(str(client.zrange(key, 0, -1)))
        elif kind == "stream":
            parts.append(str(client.xrange(key)))
    client.close()
    return "\n".join(parts)


def test_each_tenant_s_calls_carry_only_its_own_key_and_nothing_stores_it_in_clear(settings, fake, prefix, caplog):
    caplog.set_level(logging.DEBUG)
    rt = get_runtime(settings)
    rt.credentials.put("acme", seal("anthropic", ACME_KEY, settings.credential_keks))
    rt.credentials.put("globex", seal("anthropic", GLOBEX_KEY, settings.credential_keks))
    turns = {}
    for tenant in ("acme", "globex", None, "acme"):
        fake.enqueue(text_reply(f"hello {tenant}"))
        state = drive(rt, _submit(rt, tenant, f"I am {tenant}").turn_id)
        assert state.status == TurnStatus.COMPLETED, state.error
        turns[state.turn_id] = tenant
    sent = [(r.body["messages"][0]["content"][0]["text"], r.key_sha256) for r in fake.wait_for_requests(4)]
    assert sent == [
        ("I am acme", sha(ACME_KEY)),
        ("I am globex", sha(GLOBEX_KEY)),
        ("I am None", sha(FLEET_KEY)),  # a turn without a tenant key runs on the fleet's
        ("I am acme", sha(ACME_KEY)),
    ]
    stored = _everything_in_redis(prefix)
    assert "credentials" in "".join(redis.Redis.from_url(REDIS_URL, decode_responses=True).keys(f"{prefix}*"))
    for key in (ACME_KEY, GLOBEX_KEY):
        assert key not in stored  # turns, events, traces and the sealed records alike
        assert key not in caplog.text
        for turn_id in turns:
            assert key not in str([e.model_dump() for e in rt.events.read(turn_id, 0)])


def test_a_rotated_key_is_used_from_the_next_step_of_a_running_turn(settings, fake, prefix):
    rt = get_runtime(settings)
    first = _cli(settings, "set", "--tenant", "acme", "--provider", "anthropic", stdin=ACME_KEY + "\n")
    assert first.returncode == 0, first.stderr
    assert ACME_KEY not in first.stdout and "set to encrypted key" in first.stdout
    fake.enqueue(stream(tool_use_block(0, "toolu_1", "ten_lookup", ['{"key": "a"}']), stop_reason="tool_use"))
    fake.enqueue(stream(text_block(0, ["done"])))
    turn_id = _submit(rt, "acme", "rotate me").turn_id
    runner = StepRunner(rt)
    assert runner.deliver(turn_id, 0).action == "next"

    rotated = "sk-ant-acme-rotated-" + uuid.uuid4().hex
    second = _cli(settings, "set", "--tenant", "acme", "--provider", "anthropic", stdin=rotated + "\n")
    assert second.returncode == 0 and "rotated to" in second.stdout, second.stderr
    assert runner.deliver(turn_id, 1).action == "none"  # the same process: no restart, no cache flush
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED, state and state.error
    assert [r.key_sha256 for r in fake.wait_for_requests(2)] == [sha(ACME_KEY), sha(rotated)]
    assert rotated not in _everything_in_redis(prefix)

    removed = _cli(settings, "remove", "--tenant", "acme", "--provider", "anthropic")
    assert removed.returncode == 0, removed.stderr
    fake.enqueue(text_reply("fleet again"))
    drive(rt, _submit(rt, "acme", "after removal").turn_id)
    assert fake.wait_for_requests(3)[2].key_sha256 == sha(FLEET_KEY)


def test_a_secret_reference_keeps_the_key_out_of_redis(settings, fake, prefix, monkeypatch):
    monkeypatch.setenv("ACME_ANTHROPIC_KEY", ACME_KEY)  # held by the worker (this process), not by Redis
    rt = get_runtime(settings)
    rt.credentials.put("acme", reference("anthropic", "env:ACME_ANTHROPIC_KEY"))
    fake.enqueue(text_reply("hi"))
    state = drive(rt, _submit(rt, "acme", "by reference").turn_id)
    assert state.status == TurnStatus.COMPLETED, state.error
    assert fake.wait_for_requests(1)[0].key_sha256 == sha(ACME_KEY)
    monkeypatch.delenv("ACME_ANTHROPIC_KEY")
    state = drive(rt, _submit(rt, "acme", "unset").turn_id)
    assert state.status == TurnStatus.FAILED
    assert state.error == "tenant acme's anthropic key names $ACME_ANTHROPIC_KEY, which is not set on this worker"


def test_without_a_key_encryption_key_setting_a_key_is_one_line_and_a_worker_fails_closed(prefix, fake):
    bare = make_settings(prefix)
    done = _cli(bare, "set", "--tenant", "acme", "--provider", "anthropic", stdin=ACME_KEY + "\n")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "STEPQ_CREDENTIALS_KEY is not set" in done.stderr and ACME_KEY not in done.stderr
    on_argv = _cli(bare, "set", "--tenant", "acme", "--provider", "anthropic", ACME_KEY)
    assert on_argv.returncode == 2  # there is no argument that takes a key on the command line

    sealer = make_settings(prefix, credentials_key=Fernet.generate_key().decode())
    get_runtime(sealer).credentials.put("acme", seal("anthropic", ACME_KEY, sealer.credential_keks))
    rt = get_runtime(bare)
    state = drive(rt, _submit(rt, "acme", "no kek").turn_id)
    assert state.status == TurnStatus.FAILED
    assert (
        state.error
        == "tenant acme's anthropic key is encrypted, and this worker has no STEPQ_CREDENTIALS_KEY to open it"
    )
    assert fake.requests == []  # never sent on the fleet's key instead


def test_provider_batch_requests_go_in_per_tenant_batches_sent_with_that_tenant_s_key(settings, fake, prefix):
    """A provider-batch turn of a tenant with its own key never shares a batch with another tenant's or the
    fleet's requests: each batch is created, polled and read with its group's key."""
    from stepq.batches import provider as provider_batches

    rt = get_runtime(settings.model_copy(update={"provider_batch_window_s": 0}))
    rt.credentials.put("acme", seal("anthropic", ACME_KEY, settings.credential_keks))
    rt.credentials.put("globex", seal("anthropic", GLOBEX_KEY, settings.credential_keks))
    fake.enqueue(*(text_reply(f"batched {n}") for n in range(4)))
    turns = {}
    for tenant in ("acme", "globex", None, "acme"):
        metadata = {"tenant": tenant} if tenant else {}
        state, _ = create_turn(
            rt, "ten.claude", prompt=f"I am {tenant}", metadata=metadata, priority="batch", provider_batch=True
        )
        assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"  # parked for its batch
        turns[state.turn_id] = tenant
    report = provider_batches.tick(rt, force_flush=True)  # the fake ends a batch on its first poll: collected now
    assert (report.sent, report.collected) == (4, 4), report
    for turn_id, _step in report.resume:
        StepRunner(rt).deliver(turn_id, 0)
    for turn_id in turns:
        done = rt.turns.load(turn_id)
        assert done is not None and done.status == TurnStatus.COMPLETED, done and done.error

    created = [r for r in fake.requests if r.path.split("?")[0] == "/v1/messages/batches"]
    sent = sorted(
        (r.key_sha256, sorted(q["params"]["messages"][0]["content"][0]["text"] for q in r.body["requests"]))
        for r in created
    )
    assert sent == sorted(
        [
            (sha(ACME_KEY), ["I am acme", "I am acme"]),
            (sha(GLOBEX_KEY), ["I am globex"]),
            (sha(FLEET_KEY), ["I am None"]),
        ]
    )
    batch_key = {batch_id: r.key_sha256 for batch_id, r in zip(fake.batches, created, strict=True)}  # creation order
    reads = [(r.path.split("/")[4].split("?")[0], r.key_sha256) for r in fake.requests if r.path.count("/") >= 4]
    assert {batch for batch, _ in reads} == set(batch_key)  # each batch polled and its results read...
    assert all(key == batch_key[batch] for batch, key in reads)  # ...with the key that created it
    assert ACME_KEY not in _everything_in_redis(prefix) and GLOBEX_KEY not in _everything_in_redis(prefix)
