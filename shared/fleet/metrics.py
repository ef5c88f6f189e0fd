"""Prometheus metrics (low-cardinality labels only: never turn ids) and the scrape-time state gauges.

Counters and histograms are updated in-process on the step path (no Redis round trip per delta).
Gauges that describe shared state (queue depth, pending approvals) are read from Redis only when
`/metrics` is scraped, by `StateCollector`, registered in the process that serves `/metrics`.
With prefork workers these metrics use prometheus_client's multiprocess mode: see workers/metrics_server.py.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import TYPE_CHECKING

import redis
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stepq.config.settings import Settings
from stepq.fleet.protocol import celery_config, worker_queues
from stepq.models import StepLoss, ToolResultStatus
from stepq.store.connection import state_client
from stepq.store.keys import Keys

if TYPE_CHECKING:
    from stepq.fleet.runtime import Runtime
    from stepq.models import Delta, PendingApproval, StepTrace, ToolResult, TurnState, Usage
    from stepq.providers.base import ProviderError

STEP_DELIVERIES = Counter(
    "stepq_step_deliveries_total",
    "run_step deliveries by what they did (next, retry, reschedule, none)",
    ["action"],
)

RATE_LIMIT_WAITS = Counter(
    "stepq_rate_limiter_waits_total",
    "Steps re-queued because the shared rate limit had no capacity",
    ["provider", "model", "limit"],
)

TURNS = Counter(
    "stepq_turns_total",
    "Turns finished, by final status (completed, failed, cancelled)",
    ["agent", "status"],
)

STEPS = Counter(
    "stepq_steps_total",
    "Model steps (one model call each) by outcome: ok, retry, failed, parked, cancelled, lost, conflict",
    ["agent", "provider", "model", "outcome"],
)

STEP_DURATION = Histogram(
    "stepq_step_duration_seconds",
    "Wall time of one model step (model call plus its auto tools), per attempt",
    ["provider", "model"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
)

TIME_TO_FIRST_CHUNK = Histogram(
    "stepq_time_to_first_chunk_seconds",
    "From the start of the model call to its first content delta",
    ["provider", "model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60),
)

STEP_RETRIES = Counter(
    "stepq_step_retries_total",
    "Step retries before the first chunk, by reason (HTTP status or provider error code)",
    ["provider", "model", "reason"],
)

TOKENS = Counter(
    "stepq_tokens_total",
    "Tokens reported by providers (failed attempts included), by kind (input, output, cache_read, cache_write, "
    "reasoning); tenant: the turn's metadata value under STEPQ_METRICS_TENANT_KEY, else empty",
    ["agent", "tenant", "provider", "model", "kind"],
)

COST = Counter(
    "stepq_cost_total",
    "Cost of model calls at STEPQ_PRICES (failed attempts included), in the price table's currency units",
    ["agent", "tenant", "provider", "model"],
)

TOOL_CALLS = Counter(
    "stepq_tool_calls_total",
    "Tool calls resolved, by outcome (ok, error, denied, not_found, invalid_args, blocked)",
    ["agent", "tool", "outcome"],
)

TOOL_TIMEOUTS = Counter(
    "stepq_tool_timeouts_total",
    "Tool calls whose timeout was reported to the model (the function may still be running)",
    ["tool"],
)

TOOL_CALLS_LINGERING = Gauge(
    "stepq_tool_calls_lingering",
    "Tool calls still running after their timeout was reported (they hold an executor thread until they end)",
    ["tool"],
    multiprocess_mode="livesum",
)

TOOL_CALLS_REFUSED = Counter(
    "stepq_tool_calls_refused_total",
    "Tool calls not started because too many earlier calls of the tool (or of all tools) still run past their "
    "timeout (STEPQ_TOOL_MAX_LINGERING)",
    ["tool"],
)

HOOK_FAILURES = Counter(
    "stepq_hook_failures_total",
    "Lifecycle hooks (AgentDefinition.on_step_finish, ...) that raised; the turn went on unless the hook opted in",
    ["agent", "hook"],
)

UNKNOWN_TOOL = "unknown"  # the `tool` label of calls to names the agent does not have (model-invented: unbounded)
_CODE = re.compile(r"[^a-z0-9_.-]+")


# --------------------------------------------------------------------------- hot-path helpers


class FirstChunkProbe:
    """Wraps the adapter's `emit` to time the first content delta; one attribute check per delta."""

    def __init__(self, emit: Callable[[Delta], None]) -> None:
        self._emit = emit
        self.started = time.monotonic()
        self.first: float | None = None

    def __call__(self, delta: Delta) -> None:
        if self.first is None and delta.text:
            self.first = time.monotonic()
        self._emit(delta)

    def observe(self, provider: str, model: str) -> None:
        if self.first is not None:
            TIME_TO_FIRST_CHUNK.labels(provider, model).observe(self.first - self.started)


def step_outcome(action: str, reason: str, status: str) -> str | None:
    """The `outcome` label of a model step from the runner's decision and the turn's status after it."""
    if action == "retry":
        return "retry"
    if action == "next":
        return "ok"
    if action == "reschedule":
        return None  # the model was not called (rate limit): counted by stepq_rate_limiter_waits_total
    if reason == StepLoss.COMMIT_LOST:
        return "conflict"
    if reason == StepLoss.LEASE_LOST:
        return "lost"
    return {
        "completed": "ok",
        "failed": "failed",
        "cancelled": "cancelled",
        "awaiting_approval": "parked",
        "awaiting_batch": "batched",
    }.get(status, "other")


def record_step(
    state: TurnState,
    action: str,
    reason: str,
    duration_s: float,
    traces: Iterable[StepTrace],
    tenant: str = "",
) -> None:
    """Count one model step: its outcome, its duration and the tokens and cost of the traces it added
    (a failed attempt's tokens were counted when it failed: `record_usage`)."""
    outcome = step_outcome(action, reason, state.status.value)
    if outcome is None:
        return
    STEPS.labels(state.agent, state.provider, state.model, outcome).inc()
    STEP_DURATION.labels(state.provider, state.model).observe(duration_s)
    for trace in traces:
        attempts_cost = [f.cost for f in trace.failed_attempts if f.cost is not None]
        cost = None if trace.cost is None else trace.cost - sum(attempts_cost)
        record_usage(state.agent, tenant, trace.provider, trace.model, trace.usage, cost)


def record_usage(agent: str, tenant: str, provider: str, model: str, usage: Usage, cost: float | None) -> None:
    """Count one model call's tokens (by kind) and its cost."""
    for kind, value in (
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_tokens),
        ("cache_write", usage.cache_write_tokens),
        ("reasoning", usage.reasoning_tokens),
    ):
        if value:
            TOKENS.labels(agent, tenant, provider, model, kind).inc(value)
    if cost:
        COST.labels(agent, tenant, provider, model).inc(cost)


def retry_reason(exc: ProviderError) -> str:
    """`429`, `529`, `overloaded_error`, `stall`…: the HTTP status when there is one, else the error code."""
    if exc.status is not None:
        return str(exc.status)
    if exc.code:
        return _CODE.sub("_", exc.code.lower())[:40] or "error"
    return "error"


def record_retry(provider: str, model: str, exc: ProviderError) -> None:
    STEP_RETRIES.labels(provider, model, retry_reason(exc)).inc()


def tool_outcome(result: ToolResult) -> str:
    """The `outcome` label of a tool call, from its result's status."""
    if not result.is_error:
        return "ok"
    return _TOOL_OUTCOMES.get(result.status, "error")


_TOOL_OUTCOMES = {
    ToolResultStatus.DENIED: "denied",
    ToolResultStatus.INVALID_ARGUMENTS: "invalid_args",
    ToolResultStatus.NOT_FOUND: "not_found",
    ToolResultStatus.PERMANENTLY_FAILED: "blocked",
}


def record_tool_call(agent: str, result: ToolResult, known: bool) -> None:
    TOOL_CALLS.labels(agent, result.name if known else UNKNOWN_TOOL, tool_outcome(result)).inc()


# --------------------------------------------------------------------------- pending approvals index


def track_pending(rt: Runtime, approvals: list[PendingApproval]) -> None:
    """Index a parked step's approvals (after its park committed: a lost commit leaves no orphans)."""
    if approvals:
        rt.redis.zadd(rt.keys.approvals_pending, {a.approval_id: a.expires_at for a in approvals})


def untrack_pending(rt: Runtime, *approval_ids: str) -> None:
    if approval_ids:
        rt.redis.zrem(rt.keys.approvals_pending, *approval_ids)


def pending_approval_count(client: redis.Redis, prefix: str, now: float | None = None) -> int:
    """Undecided, unexpired approvals. Expired entries are pruned here: nobody can decide them any more."""
    now = time.time() if now is None else now
    key = Keys(prefix).approvals_pending
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", now)
    pipe.zcard(key)
    return int(pipe.execute()[1])


# --------------------------------------------------------------------------- queue depth

SCRAPE_SOCKET_TIMEOUT_S = 2.0
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class QueueDepths:
    """Waiting messages per queue, read from the broker (kept connection; short timeouts)."""

    def __init__(self, settings: Settings, timeout_s: float = 5.0) -> None:
        self.settings = settings
        self.url = settings.effective_broker_url
        self.timeout_s = timeout_s
        self._redis: redis.Redis | None = None

    def read(self, queues: list[str] | None = None) -> dict[str, int]:
        queues = queues or worker_queues(self.settings)
        if self.url.startswith(REDIS_SCHEMES):
            return self._redis_depths(queues)
        if self.url.startswith("memory://"):
            return {}  # in-process transport: nothing another process could read
        return self._kombu_depths(queues)

    def _redis_depths(self, queues: list[str]) -> dict[str, int]:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
            )
        keyprefix = celery_config(self.settings)["broker_transport_options"].get("global_keyprefix", "")
        lists = [Keys.broker_queue_lists(keyprefix, queue) for queue in queues]
        pipe = self._redis.pipeline(transaction=False)
        for names in lists:
            for name in names:
                pipe.llen(name)
        counts = iter(pipe.execute())
        return {q: int(sum(next(counts) for _ in names)) for q, names in zip(queues, lists, strict=True)}

    def _kombu_depths(self, queues: list[str]) -> dict[str, int]:
        """AMQP and others: a passive queue_declare reports message_count (a missing queue is skipped)."""
        from kombu import Connection

        found: dict[str, int] = {}
        with Connection(self.url, connect_timeout=self.timeout_s) as conn:
            for queue in queues:
                try:
                    channel = conn.channel()
                    try:
                        _, count, _ = channel.queue_declare(queue=queue, passive=True)
                    finally:
                        channel.close()
                except Exception:  # the queue does not exist yet: nothing waits in it
                    continue
                found[queue] = int(count)
        return found

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()


# --------------------------------------------------------------------------- scrape-time collector


class StateCollector(Collector):
    """`stepq_queue_depth{queue}` and `stepq_pending_approvals`, read from Redis at scrape time.

    Register it only in the process that serves /metrics (each serving worker reports the same fleet-wide
    values: aggregate with max(), not sum()). The reads run on a helper thread with a time budget and
    short socket timeouts: a slow or unreachable Redis drops these gauges from the scrape, it never
    delays or fails /metrics (which health checks rely on).
    """

    def __init__(self, settings: Settings, budget_s: float = 1.0) -> None:
        self.settings = settings
        self.budget_s = budget_s
        self.depths = QueueDepths(settings, timeout_s=SCRAPE_SOCKET_TIMEOUT_S)
        self._state: redis.Redis | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepq-scrape")
        self._inflight: concurrent.futures.Future[tuple[dict[str, int] | None, int | None]] | None = None
        self._lock = threading.Lock()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # scrape-time values: nothing to check at registration

    def _read(self) -> tuple[dict[str, int] | None, int | None]:
        depths: dict[str, int] | None = None
        pending: int | None = None
        with contextlib.suppress(Exception):  # the broker is unreachable: no depth gauge this scrape
            depths = self.depths.read()
        if self.settings.redis_url:
            try:
                if self._state is None:
                    self._state = state_client(
                        self.settings.redis_url,
                        socket_timeout=SCRAPE_SOCKET_TIMEOUT_S,
                        socket_connect_timeout=SCRAPE_SOCKET_TIMEOUT_S,
                    )
                pending = pending_approval_count(self._state, self.settings.state_prefix)
            except Exception:
                pending = None
        return depths, pending

    def collect(self) -> Iterator[Metric]:
        with self._lock:  # one read at a time; a scrape during a hung read waits on that same read
            if self._inflight is None or self._inflight.done():
                self._inflight = self._executor.submit(self._read)
            inflight = self._inflight
        try:
            depths, pending = inflight.result(timeout=self.budget_s)
        except concurrent.futures.TimeoutError:
            return
        if depths is not None:
            gauge = GaugeMetricFamily(
                "stepq_queue_depth", "Step messages waiting in the broker queue", labels=["queue"]
            )
            for queue, depth in depths.items():
                gauge.add_metric([queue], depth)
            yield gauge
        if pending is not None:
            yield GaugeMetricFamily(
                "stepq_pending_approvals",
                "Approvals of parked turns waiting for a decision (unexpired)",
                value=pending,
            )


# --------------------------------------------------------------------------- prefork: multiprocess mode

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
PROCESS_POOLS = frozenset({"prefork", "processes"})
OWNED_MARKER = ".stepq-owned"  # in a directory stepq created, so the worker may delete it on shutdown
OWNED_DIR_PREFIX = "stepq-metrics-"  # under the temp dir; the next `stepq worker` deletes those of dead workers


def prepare_multiprocess_dir(pool: str, environ: MutableMapping[str, str]) -> str | None:
    """For a process pool, make sure `PROMETHEUS_MULTIPROC_DIR` names an existing directory in `environ`.

    It must be set before prometheus_client is first imported in the worker (the value class is chosen
    then), so `stepq worker` sets it before exec'ing celery: a fresh temp dir unless the operator set one
    (which must then start empty, e.g. a Kubernetes emptyDir). Returns the directory, or None for thread pools.
    """
    if pool not in PROCESS_POOLS:
        return None
    path = environ.get(MULTIPROC_ENV)
    if path:
        os.makedirs(path, exist_ok=True)
        return path
    remove_stale_multiprocess_dirs()
    path = tempfile.mkdtemp(prefix=OWNED_DIR_PREFIX)
    with open(os.path.join(path, OWNED_MARKER), "w") as marker:
        marker.write(str(os.getpid()))  # `stepq worker` execs celery: the same pid runs the worker
    environ[MULTIPROC_ENV] = path
    return path


def remove_stale_multiprocess_dirs() -> None:
    """Delete the directories of `stepq worker`s that died without cleaning up (SIGKILL, OOM-kill)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), OWNED_DIR_PREFIX + "*")):
        try:
            with open(os.path.join(path, OWNED_MARKER)) as marker:
                owner = int(marker.read().strip() or 0)
        except (OSError, ValueError):
            continue  # not ours, or from before owners were recorded
        if owner > 0 and not _alive(owner):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
