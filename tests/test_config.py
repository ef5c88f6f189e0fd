"""Settings round-trip through the environment (how workers and the CLI get the producer's settings),
and a bad value stops every entry point at start with one line naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepq.config.settings import Settings, get_settings, load_settings
from stepq.errors import ConfigurationError
from stepq.fleet.ratelimit import RateLimit


def test_to_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(
        redis_url="redis://127.0.0.1:6379/3",
        agent_modules=["a.b", "c"],
        approval_secret="s3cret-s3cret-s3cret-s3cret-s3cret",
        approval_old_secrets=["old1", "old2"],
        rate_limits={"anthropic/claude": {"rpm": 5}},
        broker_transport_options={"visibility_timeout": 5},
        lease_ttl_s=2.5,
    )
    for key in list(__import__("os").environ):
        if key.startswith("STEPQ_"):
            monkeypatch.delenv(key)
    for key, value in original.to_env().items():
        monkeypatch.setenv(key, value)
    restored = Settings()
    assert restored.model_dump_json() == original.model_dump_json()
    assert (
        restored.approval_secret is not None
        and restored.approval_secret.get_secret_value() == "s3cret-s3cret-s3cret-s3cret-s3cret"
    )
    assert [s.get_secret_value() for s in restored.approval_old_secrets] == ["old1", "old2"]


def test_an_approval_secret_of_32_bytes_is_taken_and_an_empty_one_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("STEPQ_APPROVAL_SECRET", "x" * 32)
    assert load_settings().approval_secret is not None
    monkeypatch.setenv("STEPQ_APPROVAL_SECRET", "")  # `X=${X}` in a compose file: a generated secret, announced
    assert load_settings().approval_secret is None


def test_comma_separated_modules_and_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEPQ_REDIS_URL", raising=False)
    monkeypatch.setenv("STEPQ_AGENT_MODULES", "x.y, z")
    settings = Settings()
    assert settings.agent_modules == ["x.y", "z"]
    assert settings.embedded and settings.effective_broker_url == "memory://"


def test_the_demo_agents_old_module_name_still_loads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """`stepq.demo_agents` moved to `stepq.agents.demo`; a deployment's variable naming the old path loads the
    demo agents once, from their one module."""
    from stepq.agents.registry import AgentRegistry

    monkeypatch.setenv("STEPQ_AGENT_MODULES", "stepq.demo_agents,stepq.agents.demo")
    settings = Settings()
    assert settings.agent_modules == ["stepq.agents.demo"]
    agents = AgentRegistry()
    agents.load_modules(settings.agent_modules)
    assert "demo.support" in agents.ids()


# --------------------------------------------------------------------------- validated at start, in one line

# (variable, value, what the one line must say). Each value is wrong in a different way.
BAD_VALUES = [
    pytest.param("STEPQ_RATE_LIMITS", '{"anthropic": {"rpm": 5', "not valid JSON", id="rate-limits-bad-json"),
    pytest.param("STEPQ_LEASE_TTL_S", "-5", "greater than 0 (got '-5')", id="negative-ttl"),
    # was "unexpected OverflowError … (a bug in stepq)" at the first Redis call
    pytest.param(
        "STEPQ_REDIS_SOCKET_TIMEOUT_S", "inf", "input should be a finite number (got 'inf')", id="inf-timeout"
    ),
    pytest.param(
        "STEPQ_REDIS_URL",
        "localhost:6379",
        "'localhost:6379' has no scheme; use redis://host:port/db",
        id="redis-url-without-scheme",
    ),
    pytest.param(
        "STEPQ_APPROVAL_SECRET",
        "changeme-approvals",
        "18 bytes is too short to sign approval tokens; use at least 32 bytes, e.g. export STEPQ_APPROVAL_SECRET=",
        id="approval-secret-too-short",
    ),
    pytest.param(  # anyone could brute-force it and sign a JWT for any tenant (it was accepted at any length)
        "STEPQ_JWT_SECRET",
        "gateway-jwt-secret",
        "18 bytes is too short to verify HS256 JWTs; use at least 32 bytes, e.g. export STEPQ_JWT_SECRET=",
        id="jwt-secret-too-short",
    ),
]


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("STEPQ_"):
            monkeypatch.delenv(key)


def one_line_error(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    clean_env(monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    message = str(caught.value)
    assert "\n" not in message and "pydantic" not in message.lower() and "validation error" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained traceback
    return message


@pytest.mark.parametrize(("variable", "value", "expected"), BAD_VALUES)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    message = one_line_error(monkeypatch, **{variable: value})
    assert message.startswith(f"{variable}: ") and expected in message


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STEPQ_RATE_LIMITS": '{"anthropic": {"rpm": -1}}'}, "STEPQ_RATE_LIMITS: anthropic: rpm: input should be"),
        ({"STEPQ_RATE_LIMITS": '{"anthropic": {"rmp": 5}}'}, "STEPQ_RATE_LIMITS: anthropic: rmp: unknown field"),
        ({"STEPQ_RATE_LIMITS": '["anthropic"]'}, "STEPQ_RATE_LIMITS: input should be a valid dictionary"),
        ({"STEPQ_PRICES": '{"a/b": {"input_per_mtok": "cheap"}}'}, "STEPQ_PRICES: a/b: input_per_mtok: input should"),
        ({"STEPQ_PRICES": '{"a/b": {"input_per_mtk": 3}}'}, "STEPQ_PRICES: a/b: input_per_mtk: unknown field"),
        ({"STEPQ_EVENT_TTL_S": "0"}, "STEPQ_EVENT_TTL_S: input should be greater than or equal to 1"),
        ({"STEPQ_APPROVAL_TTL_S": "-1"}, "STEPQ_APPROVAL_TTL_S: input should be greater than 0"),
        ({"STEPQ_METRICS_PORT": "70000"}, "STEPQ_METRICS_PORT: input should be less than or equal to 65535"),
        ({"STEPQ_BEAT": "sometimes"}, "STEPQ_BEAT: input should be a valid boolean"),
        ({"STEPQ_REDIS_URL": "http://cache:6379"}, "STEPQ_REDIS_URL: 'http://cache:6379': the scheme must be redis://"),
        ({"STEPQ_BROKER_URL": "rabbit:5672"}, "STEPQ_BROKER_URL: 'rabbit:5672' has no scheme"),
        ({"STEPQ_KEY_PREFIX": "my app"}, "STEPQ_KEY_PREFIX: 'my app': a key prefix is non-empty"),
        (
            {"STEPQ_BROKER_TRANSPORT_OPTIONS": "{visibility_timeout: 5}"},
            "STEPQ_BROKER_TRANSPORT_OPTIONS: not valid JSON",
        ),
    ],
)
def test_each_kind_of_bad_value(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str) -> None:
    assert expected in one_line_error(monkeypatch, **env)


DURATIONS = sorted(name for name in Settings.model_fields if name.endswith(("_s", "_ms")))


@pytest.mark.parametrize("name", DURATIONS)
def test_every_duration_is_finite_and_at_most_31_years(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """An infinite or huge timeout or TTL overflowed a timestamp or a Redis expiry at its first use."""
    variable = f"STEPQ_{name.upper()}"
    for value in ("inf", "1e309", "nan"):  # refused as not finite, or (a whole-seconds one) as not an integer
        assert f"(got '{value}')" in one_line_error(monkeypatch, **{variable: value})
    huge = "1" + "0" * 30
    assert f"less than or equal to 1000000000 (got '{huge}')" in one_line_error(monkeypatch, **{variable: huge})


def test_every_bad_variable_is_named_on_the_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    message = one_line_error(monkeypatch, STEPQ_LEASE_TTL_S="-1", STEPQ_QUEUED_GRACE_S="0", STEPQ_MAX_MESSAGES="x")
    assert all(v in message for v in ("STEPQ_LEASE_TTL_S", "STEPQ_QUEUED_GRACE_S", "STEPQ_MAX_MESSAGES"))


def test_passwords_and_secrets_are_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    message = one_line_error(monkeypatch, STEPQ_REDIS_URL="admin:hunter2@cache:6379/0")
    assert "hunter2" not in message and "STEPQ_REDIS_URL: '***@cache:6379/0' has no scheme" in message
    message = one_line_error(monkeypatch, STEPQ_REDIS_URL="http://admin:hunter2@cache:6379")
    assert "hunter2" not in message and "http://***@cache:6379" in message
    message = one_line_error(monkeypatch, STEPQ_APPROVAL_SECRET="hunter2-approvals")
    assert "hunter2" not in message and message.startswith("STEPQ_APPROVAL_SECRET: 17 bytes is too short")
    message = one_line_error(monkeypatch, STEPQ_JWT_SECRET="hunter2-jwt")
    assert "hunter2" not in message and message.startswith("STEPQ_JWT_SECRET: 11 bytes is too short")
    message = one_line_error(monkeypatch, STEPQ_API_KEYS='[{"sha256": "s3cr3t-hash"')
    assert "s3cr3t" not in message and message.startswith("STEPQ_API_KEYS: not valid JSON")


def test_rate_limits_and_prices_are_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("STEPQ_RATE_LIMITS", '{"anthropic/claude": {"rpm": 5, "concurrency": 2}, "gemini": {"tpm": 9}}')
    monkeypatch.setenv("STEPQ_PRICES", '{"anthropic/claude": {"input_per_mtok": 3, "output_per_mtok": 15}}')
    monkeypatch.setenv("STEPQ_REDIS_URL", "")  # set but empty: embedded, as if unset
    settings = load_settings()
    assert settings.rate_limits == {
        "anthropic/claude": RateLimit(rpm=5, concurrency=2),
        "gemini": RateLimit(tpm=9),
    }
    prices = settings.prices["anthropic/claude"]
    assert (prices.input_per_mtok, prices.output_per_mtok, prices.cache_read_per_mtok) == (3.0, 15.0, None)
    assert settings.embedded


def test_client_refuses_a_bad_environment_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepq.producer.client import Client

    get_settings.cache_clear()
    try:
        clean_env(monkeypatch)
        monkeypatch.setenv("STEPQ_REDIS_URL", "localhost:6379")
        with pytest.raises(ConfigurationError, match=r"^STEPQ_REDIS_URL: 'localhost:6379' has no scheme"):
            Client()
    finally:
        get_settings.cache_clear()


# --------------------------------------------------------------------------- every entry point, as a user runs it

BIN = Path(sys.executable).parent
ENTRY_POINTS = [
    pytest.param([str(BIN / "stepq"), "status"], "stepq: error: ", 2, id="stepq-status"),
    pytest.param([str(BIN / "stepq"), "run", "demo.support", "hi"], "stepq: error: ", 2, id="stepq-run"),
    pytest.param([str(BIN / "stepq"), "worker"], "stepq: error: ", 2, id="stepq-worker"),
    pytest.param([str(BIN / "stepq"), "batch", "status", "b-1"], "stepq: error: ", 2, id="stepq-batch-status"),
    pytest.param([str(BIN / "celery"), "-A", "stepq.workers.celery_app", "worker"], "error: ", 2, id="celery-worker"),
    pytest.param([str(BIN / "celery"), "-A", "stepq.workers.celery_app", "beat"], "error: ", 2, id="celery-beat"),
]


@pytest.mark.parametrize(("argv", "prefix", "code"), ENTRY_POINTS)
@pytest.mark.parametrize(("variable", "value", "expected"), BAD_VALUES)
def test_every_entry_point_stops_at_start_with_one_line(
    tmp_path: Path, argv: list[str], prefix: str, code: int, variable: str, value: str, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env[variable] = value
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"{prefix}{variable}: ") and expected in lines[0]
