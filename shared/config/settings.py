"""Runtime configuration from `STEPQ_*` environment variables, validated when a process starts.

One `Settings` object is read per process; tests and the demo pass their own
instance instead of mutating the environment. Every entry point (the CLI, the
Celery app a worker or beat loads, `Client()`) reads the environment through
`load_settings()`, so a bad value stops the process at start with one line naming
the variable and the problem, instead of surfacing later inside a running step.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from stepq.config import module_models
from stepq.config.module_models import ModuleModel
from stepq.errors import ConfigurationError
from stepq.models import (
    DEFAULT_BUDGET_PRESETS,
    PRESET_NAME,
    SCOPE_ALL,
    Budget,
    Fallback,
    Policy,
    RateLimit,
    check_scope,
)

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")  # +sentinel: failover, +cluster
# Values never echoed in an error message (the variable is named, the value is not): these, and every
# SecretStr setting.
# Agent modules bundled with stepq that moved, by their old names (still accepted in STEPQ_AGENT_MODULES).
MOVED_AGENT_MODULES = {"stepq.demo_agents": "stepq.agents.demo"}
SECRET_SETTINGS = frozenset(
    {"approval_secret", "approval_old_secrets", "jwt_secret", "api_keys", "credentials_key", "credentials_old_keys"}
)
# HMAC-SHA256 keys shorter than its 32-byte output are guessable sooner than the MAC itself
MIN_HMAC_SECRET_BYTES = 32
# what each HMAC secret signs or verifies, and the variable that sets it (checked by `_check_hmac_secret`)
HMAC_SECRETS = {
    "approval_secret": ("sign approval tokens", "STEPQ_APPROVAL_SECRET"),
    "jwt_secret": ("verify HS256 JWTs", "STEPQ_JWT_SECRET"),
}


def new_secret_command(variable: str) -> str:
    """The shell line that sets `variable` to a fresh secret long enough for HMAC-SHA256."""
    return f"export {variable}=$(openssl rand -hex {MIN_HMAC_SECRET_BYTES})"


NEW_SECRET_COMMAND = new_secret_command("STEPQ_APPROVAL_SECRET")
GENERATED_SECRET_NOTICE = (
    "STEPQ_APPROVAL_SECRET is not set: approval tokens are signed with a generated secret kept in Redis, which "
    f"anyone who can read Redis can use to forge approvals; set a real one, the same on every process: {NEW_SECRET_COMMAND}"
)


MAX_SECONDS = 1_000_000_000  # ~31.7 years: a longer timeout or TTL overflows a platform timestamp or a Redis expiry
Duration = Annotated[float, Field(allow_inf_nan=False, le=MAX_SECONDS)]
"""A duration setting (seconds; milliseconds for a `_ms` one): finite and at most MAX_SECONDS. An `inf` or a `1e30`
ended every command in an OverflowError."""
WholeSeconds = Annotated[int, Field(le=MAX_SECONDS)]


class Prices(BaseModel):
    """One model's prices in `STEPQ_PRICES`, in currency units per million tokens."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    input_per_mtok: float = Field(default=0.0, ge=0)
    output_per_mtok: float = Field(default=0.0, ge=0)
    cache_read_per_mtok: float | None = Field(default=None, ge=0)  # unset: billed as input
    cache_write_per_mtok: float | None = Field(default=None, ge=0)  # unset: billed as input
    batch_factor: float = Field(default=0.5, ge=0, le=1)  # a provider-batch call's price as a share of online


class Settings(BaseSettings):
    """Every knob stepq reads. Unset `redis_url` means the embedded default (no services)."""

    # use_attribute_docstrings: each field's docstring is its description, which the settings reference
    # (docs/reference/settings.md) is generated from
    model_config = SettingsConfigDict(env_prefix="STEPQ_", extra="ignore", use_attribute_docstrings=True)

    redis_url: str | None = None  # redis://, rediss:// or unix://; unset: embedded mode
    """Redis for turn state, event logs, approvals, leases and rate limits (`redis://`, `rediss://`, `unix://`,
    `redis+sentinel://host:port[,host:port]/<master>[/<db>]` to follow Sentinel failovers, or
    `redis+cluster://host:port[,host:port]` for a Redis Cluster: turns, threads and batches spread over its masters
    and the broker must be `amqp://`, see Deploy and operate, Redis). Unset: an in-process fakeredis and the
    `memory://` broker, one process only.
    """
    broker_url: str | None = None  # any Celery broker URL; unset: redis_url
    """Celery broker (`redis://…` or `amqp://…`). Required (`amqp://`) when `STEPQ_REDIS_URL` is a cluster: a Redis
    Cluster cannot be the broker. Unset: the Redis URL.
    """
    key_prefix: str = "stepq"
    """Prefix of every Redis key stepq writes (and of Celery's keys on a Redis broker)."""
    # the sweeper's worklists are split into this many keys, each in its own Redis Cluster slot (see keys.py)
    redis_index_shards: int = Field(default=16, ge=1, le=1024)
    """How many keys (each its own Redis Cluster slot) the sweeper's worklists of active and parked turns are split
    into (1 to 1024). Change it only on a drained deployment (Deploy and operate, Redis).
    """
    agent_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated modules that define agents and tools. The embedded CLI adds `stepq.agents.demo`."""

    approval_secret: SecretStr | None = None
    """HMAC key that signs approval tokens, at least 32 bytes. Set it in production (`stepq serve` requires it). Unset:
    a generated secret kept in Redis.
    """
    approval_old_secrets: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    """Comma-separated former secrets that still verify tokens (rotation)."""
    approval_ttl_s: Duration = Field(default=3600.0, gt=0)
    """How long an approval stays open; an expired one resolves as a denial. An agent's `approval_ttl_s` overrides it."""
    # the key-encryption key of tenants' provider API keys in Redis (a Fernet key; see docs/operate/tenants.md), and the
    # older ones still opened while keys sealed with them are re-sealed (comma-separated)
    credentials_key: SecretStr | None = None
    """The Fernet key that encrypts tenants' provider API keys at rest in Redis (`stepq tenant-key set`); needed only
    when a tenant key is stored (see Deploy and operate, Tenants).
    """
    credentials_old_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    """Comma-separated former `STEPQ_CREDENTIALS_KEY` values that still decrypt stored tenant keys (rotation)."""

    provider: str | None = None
    """Provider for agents that name none (`anthropic`, `gemini`, `bedrock`, `openai`, `openai-compatible`,
    `azure-openai`, `scripted`).
    """
    model: str | None = None
    """Model for agents that name none; `provider/model` sets both."""
    # STEPQ_<MODULE>_PROVIDER / STEPQ_<MODULE>_MODEL, by module (the part of an agent id before the dot);
    # read from the environment unless given (see stepq.config.module_models)
    module_models: dict[str, ModuleModel] = Field(default=None, validate_default=True)
    """The provider / model of every agent whose id starts with `<module>.` (e.g. `STEPQ_SUPPORT_MODEL` for
    `support.*`), ahead of the agents' own defaults; read from the environment's `STEPQ_<MODULE>_PROVIDER` /
    `STEPQ_<MODULE>_MODEL` variables (a module provider comes with its module model; `provider/model` in the model
    variable sets both).
    """

    # the environment layer of the resolution chain (stepq.policy.resolution): JSON, one Policy for every agent
    # ({"max_steps": 5, "models": ["anthropic/*"]}) or policies by scope ({"*": {...}, "support.refunds": {...}})
    policy: dict[str, Policy] = Field(default_factory=dict)
    """The environment layer of the resolution chain: JSON, one policy for every agent (`{"max_steps": 5, "models":
    ["anthropic/*"]}`) or policies by scope (`{"*": {...}, "support": {...}, "support.refunds": {...}}`); fields as
    `stepq policy set` (see Concepts, Policies). Each worker applies its own at each step.
    """
    # budgets by name (`small`, `standard`, `long` and any added): JSON {"name": {max_tool_calls, max_tokens, ...}};
    # a name given replaces the default of that name, the other defaults stay (see stepq.models.DEFAULT_BUDGET_PRESETS)
    budget_presets: dict[str, Budget] = Field(default_factory=lambda: dict(DEFAULT_BUDGET_PRESETS))
    """JSON `{"name": {budget fields}}` adding or replacing the named budget presets that `LoopConfig(budget="small")`,
    `loop={"budget": ...}` and policies may name (see Deploy and operate, Tenants).
    """

    # Celery / durability
    redis_outage_s: Duration = Field(default=60.0, ge=0)  # how long Redis calls retry through an outage before failing
    """How long a Redis call retries connection errors and timeouts (backoff up to 1 s) before it fails: a restart or
    failover shorter than this costs a pause, not a turn. A Redis this process never reached (any process: a
    `Client`, a worker, the gateway, a CLI command) is given up on after 3 s instead.
    """
    redis_socket_timeout_s: Duration = Field(default=10.0, gt=0)  # per Redis read/write; a stalled call then retries
    """Socket timeout of every Redis call (a stalled call is retried within the outage window)."""
    visibility_timeout_s: WholeSeconds = Field(default=3600, ge=1)
    """Redis broker: seconds before an unacked message is handed out again."""
    # a dead worker's step is taken over within about lease_ttl_s + sweep_interval_s (renewed every third of it)
    lease_ttl_s: Duration = Field(default=6.0, gt=0)
    """A running step's lease; renewed every third of it, and once it lapses another worker may take the step over (the
    sweeper re-enqueues it).
    """
    sweep_interval_s: Duration = Field(default=1.5, gt=0)
    """How often beat runs the sweeper. A dead worker's step resumes within about lease TTL + this."""
    reschedule_countdown_s: Duration | None = Field(default=None, ge=0)  # default: lease_ttl_s / 2
    """A delivery that finds the step leased by another worker looks again after this. Unset: half of
    `STEPQ_LEASE_TTL_S`.
    """
    inline_steps: bool = True
    """A step that ends with its turn's next step runs that step in the same task while no interactive step waits
    in the broker (looked at every 20 ms), for up to 0.5 s, instead of sending it through the broker: each step
    still commits on its own, and a worker that dies between them leaves the turn to the sweeper, as for any step.
    `false`: one step per task, always.
    """
    queue: str = Field(default="stepq", min_length=1)
    """Queue for interactive turns; batch turns use `<queue>.batch`, drained after it."""
    broker_transport_options: dict[str, Any] = Field(default_factory=dict)
    """Merged into Celery's `broker_transport_options`."""
    # JSON {"provider/model" | "provider": {rpm, tpm, concurrency, ...}}; an agent's own rate_limit wins
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    """Fleet-wide limits per `"provider/model"` or `"provider"`: `{"rpm": …, "tpm": …, "concurrency": …}`."""
    prices: dict[str, Prices] = Field(default_factory=dict)  # JSON {"provider/model": {input_per_mtok, ...}}
    """Per `"provider/model"` (or `"provider"`): `{"input_per_mtok": …, "output_per_mtok": …, "cache_read_per_mtok": …,
    "cache_write_per_mtok": …, "batch_factor": 0.5}` per million tokens (cache prices default to the input price; a
    step answered through a provider batch API costs `batch_factor` of the online price). Each step's trace,
    `TurnResult.cost`, `turn-finish`, the `stepq batch` summary (the sum of its turns' costs) and `stepq_cost_total`
    carry the cost, computed in decimals: uncached input, output, cache reads and writes each at their price
    (Gemini's prompt count includes cached tokens; they are billed as cache reads only).
    """
    metrics_tenant_key: str | None = None  # metadata key whose value labels token/cost metrics as `tenant`
    """A turn metadata key whose value labels `stepq_tokens_total` and `stepq_cost_total` as `tenant`."""
    queued_grace_s: Duration = Field(default=300.0, gt=0)  # a queued turn untouched this long lost its message
    """A queued or running turn untouched this long is presumed to have lost its message and is re-enqueued."""
    beat: bool = True  # `stepq worker` runs the sweeper's schedule unless --no-beat
    """Whether `stepq worker` embeds beat (the sweeper's schedule); `--beat` / `--no-beat` override it."""
    memory_polling_interval_s: Duration = Field(default=0.01, gt=0)
    """Embedded mode: how often the `memory://` broker is polled."""

    # Observability
    metrics_port: int = Field(default=9464, ge=0, le=65535)  # each worker serves /metrics here; 0 disables
    """Each worker serves Prometheus metrics at `/metrics` on the first free port from this one up (several workers
    share a host; `stepq worker --metrics-port N` sets it per worker); `0` disables. See Deploy and operate,
    Metrics.
    """
    metrics_host: str = "0.0.0.0"
    """Address the metrics server binds."""
    log_json: bool = False  # one JSON object per log line
    """Logs as one JSON object per line (with `turn_id`, `step`, `attempt` inside a step). Secrets are redacted either
    way.
    """

    # Retry before the first chunk
    retry_base_s: Duration = Field(default=1.0, ge=0)
    """Retry before the first chunk: backoff base (full jitter) when the provider gives no retry-after."""
    retry_cap_s: Duration = Field(default=30.0, ge=0)
    """Longest backoff."""
    retry_max_attempts: int = Field(default=5, ge=0)
    """Attempts per step before the turn fails (or fails over)."""
    # JSON list of {provider, model} (or "provider/model") a step fails over to, in order, when its attempts
    # are exhausted before any content streamed; an agent's own `fallbacks` win
    fallbacks: list[Fallback] = Field(default_factory=list)
    """JSON list of `{"provider", "model"}` (or `"provider/model"`) a step fails over to, in order, for agents without
    `fallbacks` of their own (see Providers, Failover). An unknown provider or a malformed entry stops every process
    at start with one line.
    """

    # Provider batch APIs (turns submitted with provider_batch=True; see docs/operate/batches.md)
    provider_batch_window_s: Duration = Field(default=60.0, ge=0)  # a group is sent once its oldest request waited this
    """Provider batch APIs: a group (provider/model) of parked requests is sent once its oldest waited this long..."""
    provider_batch_max_size: int = Field(default=1000, ge=1)  # ...or once it holds this many requests
    """...or once it holds this many (one provider batch each)."""
    provider_batch_poll_s: Duration = Field(default=30.0, gt=0)  # the flush-and-poll tick's period
    """How often beat runs the provider-batch tick (flush parked requests, poll open batches)."""
    provider_batch_deadline_s: Duration = Field(default=24 * 3600.0, gt=0)  # then a pending request runs online
    """A request still unanswered this long after its step parked is cancelled and the step runs online."""
    provider_batch_online_fallback: bool = True  # a request whose batch attempts all failed runs online
    """A request that failed in its batch on every attempt (`STEPQ_RETRY_MAX_ATTEMPTS`) runs online; `false` fails the
    turn instead.
    """
    # s3://bucket/prefix for Bedrock batch inference input and output (the provider reads the same variable)
    bedrock_batch_bucket: str | None = Field(default=None, pattern=r"^s3://[a-z0-9][a-z0-9.-]+(/.*)?$")
    """`s3://bucket/prefix` where Bedrock batch inference jobs read their input and write their output; unset: Bedrock
    steps of provider-batch turns run online.
    """
    bedrock_batch_role_arn: str | None = None  # the IAM role Bedrock assumes to read and write that bucket
    """The IAM role Bedrock assumes for those jobs (it needs read and write on the bucket prefix)."""

    # Streams
    coalesce_window_ms: Duration = Field(default=10.0, ge=0)
    """Text deltas are merged per window before they are published; `0` publishes each one."""
    event_ttl_s: WholeSeconds = Field(default=24 * 3600, ge=1)  # a finished turn's state and events are kept this long
    """How long a finished turn's state and events are kept."""
    thread_ttl_s: WholeSeconds = Field(default=30 * 24 * 3600, ge=1)  # a thread outlives its turns; renewed on each use
    """How long a thread (a conversation continued with `Client.continue_thread` or `POST /v1/threads/{id}/turns`) is
    kept after its last use, apart from its turns.
    """
    event_maxlen: int = Field(default=100_000, ge=1, le=1_000_000_000)  # more would not fit in any Redis
    """Cap on one turn's event log."""
    cancel_poll_s: Duration = Field(default=0.05, gt=0)
    """How often a running step checks for cancellation."""

    # Input limits
    max_prompt_chars: int = Field(default=200_000, ge=1)
    """Largest prompt (or message list) accepted at submit."""
    max_messages: int = Field(default=500, ge=1)
    """Most messages accepted at submit."""
    max_tool_result_chars: int = Field(default=20_000, ge=1)
    """Tool results longer than this are truncated, with a marker, before the model sees them."""
    compact_at: float = Field(default=0.8, ge=0, le=1)  # of the context window; 0 turns compaction off
    """Compact what the model sees when a request would fill more than this share of the model's context window; `0`
    turns compaction off. See Guides, Compaction.
    """
    context_windows: dict[str, Annotated[int, Field(gt=0)]] = Field(
        default_factory=dict
    )  # {"provider/model" | "model": tokens}
    """Context windows in tokens by `"provider/model"` or `"model"`, over the built-in table
    (`shared/engine/compaction.py`).
    """
    compact_keep_recent: int = Field(default=4, ge=1)  # latest messages whose tool results are never cut
    """The latest messages whose tool results compaction never cuts."""
    compact_tool_result_chars: int = Field(default=500, ge=0)  # what an older tool result is cut to
    """What an older tool result is cut to when compacting."""
    tool_max_lingering: int = Field(default=4, ge=1)  # per tool: calls still running past their timeout
    """Calls of one tool still running after their timeout (ignoring `ctx.cancelled`) a worker process tolerates; more
    calls of that tool are refused until one ends.
    """
    tool_error_chars: int = Field(default=300, ge=20)  # a tool exception's message as the model reads it
    """A raising tool's message, as the model reads it, is cut to this (after secrets are masked)."""

    # Attachments: files in user messages, checked at submit and stored once per turn
    attachment_max_bytes: int = Field(default=32 * 2**20, ge=1)  # one file
    """Largest file accepted at submit (and fetched from a URL by a worker). See Guides, Attachments."""
    attachment_turn_max_bytes: int = Field(default=64 * 2**20, ge=1)  # every file of one turn together
    """Most bytes of files one turn may carry."""
    attachment_redis_max_bytes: int = Field(default=32 * 2**20, ge=0)  # a larger file goes to the object store
    """Largest file stored in Redis; a larger one goes to `STEPQ_ATTACHMENT_STORE_URL`, or is refused without it."""
    # s3://bucket/prefix: where files above attachment_redis_max_bytes go (through boto3)
    attachment_store_url: str | None = Field(default=None, pattern=r"^s3://[a-z0-9][a-z0-9.-]+(/.*)?$")
    """`s3://bucket/prefix` for files above the Redis threshold (boto3, the worker's and producer's AWS credentials)."""
    # URL prefixes (scheme://host[:port][/path]) whose files a worker may fetch; empty: URLs are refused
    attachment_url_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated `scheme://host[:port][/path]` (or `s3://bucket/prefix`) prefixes of URLs a worker may fetch
    files from; empty refuses every http(s) and s3 file URL.
    """

    # HTTP gateway (`stepq serve`); with no API keys and no JWT settings it starts only with --insecure-dev
    api_keys: list[dict[str, Any]] = Field(default_factory=list)  # JSON: [{sha256, tenant, subject, scopes}]
    """Gateway API keys, JSON: `[{"sha256": "<hex of sha256(key)>", "tenant": "…", "subject": "…", "scopes": ["submit",
    "read", "approve"]}]`; an optional `"policy": {...}` (a `Policy`) is the caller layer of that key's turns.
    """
    api_keys_file: str | None = None  # the same JSON list in a file (a mounted secret)
    """The same list in a file (a mounted secret)."""
    jwt_secret: SecretStr | None = None  # HS256
    """Gateway: HS256 secret for bearer JWTs, at least 32 bytes (`openssl rand -hex 32`)."""
    jwt_jwks_file: str | None = None  # RS256: a JWKS document on disk
    """Gateway: a JWKS document whose keys verify RS256 JWTs (picked by `kid`)."""
    jwt_audience: str | None = None
    """Checked in JWTs when set."""
    jwt_issuer: str | None = None
    """Checked in JWTs when set."""
    jwt_tenant_claim: str = "tenant"
    """The JWT claim naming the caller's tenant."""
    gateway_host: str = "127.0.0.1"
    """Where `stepq serve` listens (`--host` / `--port` override)."""
    gateway_port: int = Field(default=8000, ge=0, le=65535)
    """Where `stepq serve` listens (`--host` / `--port` override)."""
    gateway_cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated origins allowed to call the gateway from a browser."""
    gateway_max_body_bytes: int = Field(default=1_000_000, ge=1)
    """Larger request bodies answer 413."""
    gateway_rate_limit_rpm: int = Field(default=600, ge=0)  # per credential; 0 turns it off
    """Requests a minute per credential, shared by every gateway replica through Redis; `0` turns it off."""
    gateway_keepalive_s: Duration = Field(default=15.0, gt=0, le=15.0)
    """Keep-alive comment interval on a quiet SSE stream (at most 15)."""
    gateway_redis_pool: int = Field(default=16, ge=2)  # async connections besides the one pub/sub connection
    """Async Redis connections per gateway process for commands, besides its one pub/sub connection."""
    gateway_chat_agent: str | None = None  # POST /v1/chat's agent when the request names none
    """The agent of `POST /v1/chat` when the request names none (neither `?agent=`, the body's `agent`, nor the
    thread's).
    """

    @field_validator("redis_url", "broker_url", mode="before")
    @classmethod
    def _check_url(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        value = value.strip()
        if not value:
            return None  # set but empty: the same as unset
        shown = _without_password(value)
        scheme, sep, _ = value.partition("://")
        if not sep or not scheme:
            example = (
                "redis://host:port/db" if info.field_name == "redis_url" else "redis://host:port/db or amqp://host"
            )
            raise ValueError(f"{shown!r} has no scheme; use {example}")
        if info.field_name == "redis_url" and scheme.lower() not in REDIS_SCHEMES:
            raise ValueError(
                f"{shown!r}: the scheme must be redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"
            )
        if info.field_name == "broker_url" and scheme.lower() == "redis+cluster":
            raise ValueError(f"{shown!r}: Celery cannot use a Redis Cluster as its broker; use amqp://host (RabbitMQ)")
        return value

    @field_validator(*HMAC_SECRETS)
    @classmethod
    def _check_hmac_secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """A short HMAC key makes every token it signs (an approval's, a gateway JWT) forgeable by guessing the key:
        refuse it at start, not in production (RFC 7518 §3.2: at least the hash's 32 bytes for HS256).

        Former secrets (STEPQ_APPROVAL_OLD_SECRETS) are not checked: rotating away from a short one must work."""
        if value is None or not value.get_secret_value():  # set but empty (`X=${X}` in compose): unset
            return None
        size = len(value.get_secret_value().encode())
        if size < MIN_HMAC_SECRET_BYTES:
            what, variable = HMAC_SECRETS[str(info.field_name)]
            raise ValueError(
                f"{size} bytes is too short to {what}; use at least {MIN_HMAC_SECRET_BYTES} bytes, "
                f"e.g. {new_secret_command(variable)}"
            )
        return value

    @field_validator("fallbacks")
    @classmethod
    def _check_fallbacks(cls, value: list[Fallback]) -> list[Fallback]:
        """An unknown provider would surface only when a step fails over, mid-outage: refuse it at start."""
        known = module_models.known_providers()
        for n, fallback in enumerate(value):
            if fallback.provider not in known:
                raise ValueError(f"entry {n} names unknown provider {fallback.provider!r}; known: {', '.join(known)}")
        return value

    @field_validator("module_models", mode="before")
    @classmethod
    def _module_models(cls, value: object) -> object:
        """Variables named after modules cannot be declared fields: they are found by scanning the environment."""
        if value is None:
            return module_models.from_environ(os.environ)
        if isinstance(value, dict):
            return module_models.check({k: ModuleModel.model_validate(v) for k, v in value.items()})
        return value

    @field_validator("budget_presets")
    @classmethod
    def _preset_names(cls, value: dict[str, Budget]) -> dict[str, Budget]:
        """Named presets join the defaults; a name is lowercase (`small`, `nightly-batch`)."""
        for name in value:
            if not PRESET_NAME.match(name):
                raise ValueError(f"preset name {name!r} must be lowercase letters, digits, '-' or '_'")
        return {**DEFAULT_BUDGET_PRESETS, **value}

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_scopes(cls, value: object) -> object:
        """One policy's fields apply to every agent (scope `*`); otherwise the keys are scopes."""
        if not isinstance(value, dict):
            return value
        if value and set(value) <= set(Policy.model_fields):
            return {SCOPE_ALL: value}
        for scope in value:
            check_scope(str(scope))
        return value

    @field_validator("policy")
    @classmethod
    def _no_quota(cls, value: dict[str, Policy]) -> dict[str, Policy]:
        """A quota counts a tenant's usage: only a tenant's policy holds one, never silently ignored here."""
        for scope, policy in value.items():
            if policy.quota is not None:
                raise ValueError(f"{scope}: a quota belongs in a tenant's policy (stepq policy set --quota-tokens N)")
        return value

    @field_validator("key_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not value or re.search(r"[\s{}]", value):
            raise ValueError(f"{value!r}: a key prefix is non-empty, without spaces or braces")
        return value

    @field_validator("agent_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):  # a module that moved keeps its old name: deployments name it in variables
            return list(dict.fromkeys(MOVED_AGENT_MODULES.get(name, name) for name in value))
        return value

    @field_validator(
        "approval_old_secrets", "credentials_old_keys", "gateway_cors_origins", "attachment_url_allow", mode="before"
    )
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
            if name == "module_models":  # one variable pair per module, as an operator sets them
                env.update(module_models.to_env(self.module_models))
                continue
            key = f"STEPQ_{name.upper()}"
            if name == "approval_secret":
                env[key] = self.approval_secret.get_secret_value() if self.approval_secret else ""
            elif name == "jwt_secret":
                env[key] = self.jwt_secret.get_secret_value() if self.jwt_secret else ""
            elif name == "approval_old_secrets":
                env[key] = ",".join(s.get_secret_value() for s in self.approval_old_secrets)
            elif name == "credentials_key":
                env[key] = self.credentials_key.get_secret_value() if self.credentials_key else ""
            elif name == "credentials_old_keys":
                env[key] = ",".join(s.get_secret_value() for s in self.credentials_old_keys)
            elif name in ("agent_modules", "gateway_cors_origins", "attachment_url_allow"):
                env[key] = ",".join(value)
            elif isinstance(value, dict | list):
                env[key] = json.dumps(value)
            else:
                env[key] = str(value)
        return env

    @property
    def credential_keks(self) -> list[str]:
        """The key-encryption keys, newest first (the first seals; all open)."""
        keys = [self.credentials_key, *self.credentials_old_keys] if self.credentials_key else self.credentials_old_keys
        return [k.get_secret_value() for k in keys if k is not None]

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured: fakeredis + Celery's memory transport in one process."""
        return not self.redis_url

    @property
    def redis_cluster(self) -> bool:
        """True when `redis_url` names a Redis Cluster (`redis+cluster://host:port[,host:port...]`)."""
        return bool(self.redis_url) and str(self.redis_url).lower().startswith("redis+cluster://")

    @property
    def state_prefix(self) -> str:
        """The prefix of stepq's Redis keys: the same on a single Redis and a Redis Cluster (the keys carry their
        own hash tags, see stepq.store.keys, so a cluster spreads them over its masters)."""
        return self.key_prefix

    @property
    def effective_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        if self.redis_cluster:
            raise ConfigurationError(
                "STEPQ_REDIS_URL is a Redis Cluster, which cannot be Celery's broker: set STEPQ_BROKER_URL=amqp://host"
            )
        return self.redis_url or "memory://"

    @property
    def effective_reschedule_countdown_s(self) -> float:
        if self.reschedule_countdown_s is not None:
            return self.reschedule_countdown_s
        return max(self.lease_ttl_s / 2, 0.05)


def load_settings() -> Settings:
    """Settings from the environment, or ConfigurationError with one line naming each bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigurationError("; ".join(_describe(e) for e in exc.errors())) from None
    except SettingsError as exc:  # a JSON-valued variable that is not JSON (pydantic-settings decodes those)
        raise ConfigurationError(_describe_undecodable(exc)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment (see `load_settings`)."""
    return load_settings()


def _variable(field: str) -> str:
    return f"STEPQ_{field.upper()}"


def _describe(error: ErrorDetails) -> str:
    field, *inside = [str(part) for part in error["loc"]] or [""]  # a model-level check has no location
    where = (_variable(field) if field else "STEPQ_* settings") + "".join(f": {part}" for part in inside)
    if error["type"] == "value_error" and field == "module_models":  # the message names the variable itself
        return str(error["ctx"]["error"])
    if error["type"] == "value_error":  # our own validators: the message already says it all
        return f"{where}: {error['ctx']['error']}"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field"
    message = error["msg"][:1].lower() + error["msg"][1:]
    value = error.get("input")
    if not _is_secret(field) and isinstance(value, str | int | float) and len(str(value)) <= 80:
        message += f" (got {value!r})"
    return f"{where}: {message}"


def _is_secret(field: str) -> bool:
    declared = Settings.model_fields.get(field)
    return field in SECRET_SETTINGS or declared is None or "SecretStr" in repr(declared.annotation)


def _describe_undecodable(exc: SettingsError) -> str:
    found = re.search(r'field "(\w+)"', str(exc))
    where = _variable(found.group(1)) if found else "a STEPQ_ variable"
    cause = exc.__cause__
    if isinstance(cause, json.JSONDecodeError):
        return f"{where}: not valid JSON ({cause.msg} at line {cause.lineno} column {cause.colno})"
    return f"{where}: {cause or exc}"


def _without_password(url: str) -> str:
    """The URL as it may appear in an error message: any user:password part masked."""
    head, at, host = url.rpartition("@")
    if not at:
        return url
    scheme, sep, _ = head.partition("://")
    return f"{scheme}://***@{host}" if sep else f"***@{host}"
