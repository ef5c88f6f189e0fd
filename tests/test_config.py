"""Settings round-trip through the environment (how workers and the CLI get the producer's settings)."""

from __future__ import annotations

import pytest

from stepq.config import Settings


def test_to_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(
        redis_url="redis://127.0.0.1:6379/3",
        agent_modules=["a.b", "c"],
        approval_secret="s3cret",
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
    assert restored.approval_secret is not None and restored.approval_secret.get_secret_value() == "s3cret"
    assert [s.get_secret_value() for s in restored.approval_old_secrets] == ["old1", "old2"]


def test_comma_separated_modules_and_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEPQ_REDIS_URL", raising=False)
    monkeypatch.setenv("STEPQ_AGENT_MODULES", "x.y, z")
    settings = Settings()
    assert settings.agent_modules == ["x.y", "z"]
    assert settings.embedded and settings.effective_broker_url == "memory://"
