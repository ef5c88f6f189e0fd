"""Runtime configuration from `STEPQ_*` environment variables.

One `Settings` object is read per process; tests and the demo pass their own
instance instead of mutating the environment.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob stepq reads. Unset `redis_url` means the embedded default (no services)."""

    model_config = SettingsConfigDict(env_prefix="STEPQ_", extra="ignore")

    redis_url: str | None = None
    broker_url: str | None = None
    key_prefix: str = "stepq"
    agent_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)

    approval_secret: SecretStr | None = None
    approval_old_secrets: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    approval_ttl_s: float = 3600.0

    provider: str | None = None
    model: str | None = None

    # Celery / durability
    visibility_timeout_s: int = 3600
    lease_ttl_s: float = 30.0
    sweep_interval_s: float = 10.0
    reschedule_countdown_s: float | None = None  # default: lease_ttl_s / 2
    queue: str = "stepq"
    broker_transport_options: dict[str, Any] = Field(default_factory=dict)
    rate_limits: dict[str, Any] = Field(
        default_factory=dict
    )  # {"provider/model" | "provider": {rpm, tpm, concurrency}}
    prices: dict[str, Any] = Field(default_factory=dict)  # {"provider/model": {input_per_mtok, output_per_mtok}}
    queued_grace_s: float = 300.0  # a queued turn untouched this long is presumed to have lost its message
    beat: bool = True  # `stepq worker` runs the sweeper's schedule unless --no-beat
    memory_polling_interval_s: float = 0.01

    # Observability
    metrics_port: int = 9464  # each worker serves /metrics here; 0 disables
    metrics_host: str = "0.0.0.0"
    log_json: bool = False  # one JSON object per log line

    # Retry before the first chunk
    retry_base_s: float = 1.0
    retry_cap_s: float = 30.0
    retry_max_attempts: int = 5

    # Streams
    coalesce_window_ms: float = 10.0
    event_ttl_s: int = 24 * 3600
    event_maxlen: int = 100_000
    cancel_poll_s: float = 0.05

    # Input limits
    max_prompt_chars: int = 200_000
    max_messages: int = 500
    max_tool_result_chars: int = 20_000

    # HTTP gateway (`stepq serve`); with no API keys and no JWT settings it starts only with --insecure-dev
    api_keys: list[dict[str, Any]] = Field(default_factory=list)  # JSON: [{sha256, tenant, subject, scopes}]
    api_keys_file: str | None = None  # the same JSON list in a file (a mounted secret)
    jwt_secret: SecretStr | None = None  # HS256
    jwt_jwks_file: str | None = None  # RS256: a JWKS document on disk
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_tenant_claim: str = "tenant"
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=8000, ge=0, le=65535)
    gateway_cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    gateway_max_body_bytes: int = Field(default=1_000_000, ge=1)
    gateway_rate_limit_rpm: int = Field(default=600, ge=0)  # per credential; 0 turns it off
    gateway_keepalive_s: float = Field(default=15.0, gt=0, le=15.0)
    gateway_redis_pool: int = Field(default=16, ge=2)  # async connections besides the one pub/sub connection

    @field_validator("agent_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("approval_old_secrets", "gateway_cors_origins", mode="before")
    @classmethod
    def _split_secrets(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def to_env(self) -> dict[str, str]:
        """The `STEPQ_*` variables that give another process (a worker, the CLI) exactly these settings."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            key = f"STEPQ_{name.upper()}"
            if name == "approval_secret":
                env[key] = self.approval_secret.get_secret_value() if self.approval_secret else ""
            elif name == "jwt_secret":
                env[key] = self.jwt_secret.get_secret_value() if self.jwt_secret else ""
            elif name == "approval_old_secrets":
                env[key] = ",".join(s.get_secret_value() for s in self.approval_old_secrets)
            elif name in ("agent_modules", "gateway_cors_origins"):
                env[key] = ",".join(value)
            elif isinstance(value, dict | list):
                env[key] = json.dumps(value)
            else:
                env[key] = str(value)
        return env

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured: fakeredis + Celery's memory transport in one process."""
        return not self.redis_url

    @property
    def effective_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return self.redis_url or "memory://"

    @property
    def effective_reschedule_countdown_s(self) -> float:
        if self.reschedule_countdown_s is not None:
            return self.reschedule_countdown_s
        return max(self.lease_ttl_s / 2, 0.05)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
