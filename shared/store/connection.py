"""Redis clients: a real server from `STEPQ_REDIS_URL`, or one in-process fakeredis for the embedded mode.

`STEPQ_REDIS_URL` may name Sentinels instead of a server, for automatic failover:
`redis+sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]`. The client asks the
Sentinels for the current master and, after a failover, reconnects to the new one (a write that reaches
the demoted master fails as a connection error, which the outage retry below waits out).

Outages are waited out, not died of: every client has explicit socket timeouts, and a command that
fails with a connection error or a timeout is retried with capped exponential backoff until the
outage window (`STEPQ_REDIS_OUTAGE_S`) has passed since its first failure. A Redis restart or a
failover (tens of seconds) then costs a pause, not a failed turn; only a longer outage raises.
The window is for a Redis that answered before: until a URL has answered once in this process, a call
gives up after FIRST_CONTACT_S (a wrong URL or a server that is not up is an error to show now, in every
process: a client, a worker, the gateway).

`STEPQ_REDIS_URL` may name a Redis Cluster instead: `redis+cluster://[:password@]host:port[,host:port...]`
(any reachable nodes; the client learns the rest). stepq's keys carry hash tags that keep each script
and transaction in one slot while spreading turns, threads and batches over every master (see keys.py).
"""

from __future__ import annotations

import math
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

from stepq.config.settings import Settings
from stepq.errors import ConfigurationError, MissingExtraError

if TYPE_CHECKING:
    import fakeredis

_lock = threading.Lock()
_clients: dict[str, redis.Redis] = {}
_fake_server: fakeredis.FakeServer | None = None
# redis-py 8 caps a pool at 100 connections and raises MaxConnectionsError past it. A worker holds up to one per
# step thread (plus pub/sub followers), so `--concurrency` above ~100 failed steps. Redis's own default maxclients;
# `?max_connections=N` in STEPQ_REDIS_URL overrides it.
MAX_CONNECTIONS = 10_000
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, socket.timeout)
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0
FIRST_CONTACT_S = 3.0  # how long a call tries a Redis URL that has never answered in this process
FIRST_CONTACT_RETRY_S = 2.5  # the last retry starts by then, so the call gives up within FIRST_CONTACT_S

T = TypeVar("T")
_reached: set[str] = set()  # URLs (or "embedded") that answered at least once in this process
_first_tried: dict[str, float] = {}  # when this process first called a URL (monotonic clock)


def _url_key(settings: Settings) -> str:
    return settings.redis_url or "embedded"


def ever_reached(settings: Settings) -> bool:
    """Whether this process has had an answer from `STEPQ_REDIS_URL` (the embedded stand-in always answers)."""
    return settings.embedded or _url_key(settings) in _reached


class OutageRetry(Retry):
    """redis-py's Retry bounded by time, not by a count: retry transient errors (capped exponential backoff
    with jitter) until `window_s` have passed since the first failure of this call, then raise the last.

    A URL that never answered in this process gets FIRST_CONTACT_S from its first call instead: the
    outage window rides out an outage of a Redis that was there, not a wrong URL. (The reach is kept per URL
    at module level: redis-py deep-copies the Retry into every connection.)"""

    def __init__(self, window_s: float, url: str = "") -> None:
        super().__init__(NoBackoff(), -1, TRANSIENT_ERRORS)
        self.window_s = window_s
        self.url = url

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, OutageRetry) and (other.window_s, other.url) == (self.window_s, self.url)

    __hash__ = Retry.__hash__

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        failures = 0
        started = time.monotonic()
        deadline: float | None = None
        while True:
            try:
                result = do()
                _reached.add(self.url)
                return result
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                now = time.monotonic()
                deadline = deadline if deadline is not None else self._deadline(started, now)
                if now >= deadline:
                    raise error
                pause = random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**failures)
                time.sleep(min(pause, max(deadline - now, 0.0)))  # backoff between attempts, not synchronization

    def _deadline(self, started: float, first_failure: float) -> float:
        """The window after the first failure; for a URL never reached, FIRST_CONTACT_S after the process
        first called it (so a submit's few calls share the 3 s, and each later call tries once)."""
        if self.url in _reached:
            return first_failure + self.window_s
        return _first_tried.setdefault(self.url, started) + min(self.window_s, FIRST_CONTACT_RETRY_S)


def get_redis(settings: Settings) -> redis.Redis:
    """One shared, thread-safe client per URL (redis-py pools connections internally)."""
    key = _url_key(settings)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _make_client(settings)
            _clients[key] = client
        return client


def get_many(client: redis.Redis, keys: list[str]) -> list[str | None]:
    """MGET of keys in any slots: one MGET on a single Redis; on a cluster, one per slot (pipelined per node),
    since a cluster refuses an MGET across slots (turns live in many)."""
    if isinstance(client, RedisCluster):
        return cast(list[str | None], client.mget_nonatomic(keys))
    return cast(list[str | None], client.mget(keys))


def disconnect(client: redis.Redis) -> None:
    """Close a shared client's sockets (a server shutting down); it stays usable and reconnects on its next command."""
    if isinstance(client, RedisCluster):
        client.disconnect_connection_pools()
    else:
        client.connection_pool.disconnect()


def first_contact(settings: Settings) -> None:
    """Reach Redis once within FIRST_CONTACT_S, else raise redis-py's ConnectionError (or TimeoutError).

    For a process's start (a one-shot command, a worker, `stepq serve`): a Redis that never answered is a
    wrong URL or a server that is down, an error to show in one line now. The probe's own (shorter) socket
    timeout also bounds a server that accepts connections but never answers."""
    probe = settings.model_copy(
        update={
            "redis_outage_s": min(settings.redis_outage_s, FIRST_CONTACT_S),
            "redis_socket_timeout_s": min(settings.redis_socket_timeout_s, FIRST_CONTACT_S),
        }
    )
    try:
        client = _make_client(probe)
        try:
            client.ping()
        finally:
            client.close()
    except RedisClusterException as exc:  # the cluster client connects (and fails) in its constructor
        raise RedisConnectionError(str(exc)) from None
    except ResponseError as exc:  # it answered, with an error: the connection's setup (SELECT, HELLO) or PING
        hint = " (the database number in the URL is past the server's `databases`)" if "DB index" in str(exc) else ""
        raise ConfigurationError(f"STEPQ_REDIS_URL: Redis refused stepq's first command: {exc}{hint}") from None
    _reached.add(_url_key(settings))


def client_options(settings: Settings) -> dict[str, Any]:
    """Timeouts and the outage retry every (synchronous) stepq Redis client gets."""
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        # within FIRST_CONTACT_S, so a first call to an address that drops packets can give up in time
        "socket_connect_timeout": min(settings.redis_socket_timeout_s, FIRST_CONTACT_S),
        "socket_keepalive": True,
        "retry": OutageRetry(settings.redis_outage_s, _url_key(settings)),
        "retry_on_error": list(TRANSIENT_ERRORS),
        "health_check_interval": 30,
    }


SENTINEL_SCHEME = "redis+sentinel://"
CLUSTER_SCHEME = "redis+cluster://"


@dataclass(frozen=True)
class ClusterTarget:
    nodes: list[tuple[str, int]]
    password: str | None


def parse_cluster_url(url: str) -> ClusterTarget:
    """`redis+cluster://[:password@]host:port[,host:port...]` (no database: a cluster has only db 0)."""
    parsed = urllib.parse.urlsplit(url)
    creds, _, hosts = parsed.netloc.rpartition("@")
    password = urllib.parse.unquote(creds.partition(":")[2] if ":" in creds else creds) or None
    nodes = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ConfigurationError(f"STEPQ_REDIS_URL: cluster node {host!r} needs host:port")
        nodes.append((name, int(port)))
    if not nodes or parsed.path.strip("/"):
        raise ConfigurationError(
            "STEPQ_REDIS_URL: a cluster URL is redis+cluster://[:password@]host:port[,host:port...]"
        )
    return ClusterTarget(nodes, password)


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """redis-py's cluster client over the nodes the URL names (it discovers the others itself)."""
    target = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        password=target.password,
        decode_responses=True,
        **options,
    )


def cluster_options(settings: Settings) -> dict[str, Any]:
    """The cluster client counts its retries (it re-reads the slot map between them) instead of timing them:
    enough capped-backoff attempts to span the outage window."""
    options = client_options(settings)
    del options["retry_on_error"], options["health_check_interval"]
    attempts = max(3, math.ceil(settings.redis_outage_s / BACKOFF_CAP_S))
    options["retry"] = Retry(ExponentialWithJitterBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), attempts)
    return options


def state_client(url: str, **options: Any) -> redis.Redis:
    """A plain client for `STEPQ_REDIS_URL` with the caller's options (a cluster URL gets the cluster client)."""
    if url.startswith(CLUSTER_SCHEME):
        return cast("redis.Redis", cluster_client(url, **options))
    return redis.Redis.from_url(url, **options)


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    password: str | None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """`redis+sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]`."""
    parsed = urllib.parse.urlsplit(url)
    creds, _, hosts = parsed.netloc.rpartition("@")
    password = urllib.parse.unquote(creds.partition(":")[2] if ":" in creds else creds) or None
    sentinels = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        if not port.isdigit():
            raise ConfigurationError(f"STEPQ_REDIS_URL: sentinel address {host!r} needs a numeric port")
        sentinels.append((name, int(port)))
    parts = [p for p in parsed.path.split("/") if p]
    if not sentinels or not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ConfigurationError(
            "STEPQ_REDIS_URL: a Sentinel URL is redis+sentinel://[:password@]host:port[,host:port...]/<master>[/<db>]"
        )
    return SentinelTarget(sentinels, parts[0], int(parts[1]) if len(parts) == 2 else 0, password)


def kombu_sentinel_broker(url: str) -> tuple[str, dict[str, Any]]:
    """The same Sentinels as a kombu broker URL plus its transport options (`master_name`)."""
    target = parse_sentinel_url(url)
    auth = f":{urllib.parse.quote(target.password, safe='')}@" if target.password else ""
    joined = ";".join(f"sentinel://{auth}{host}:{port}/{target.db}" for host, port in target.sentinels)
    return joined, {"master_name": target.service}


def _sentinel_client(settings: Settings, url: str) -> redis.Redis:
    target = parse_sentinel_url(url)
    timeouts = {"socket_timeout": settings.redis_socket_timeout_s, "socket_connect_timeout": 5.0}
    sentinel = Sentinel(target.sentinels, sentinel_kwargs=timeouts)
    client: redis.Redis = sentinel.master_for(
        target.service,
        db=target.db,
        password=target.password,
        decode_responses=True,
        max_connections=MAX_CONNECTIONS,
        **client_options(settings),
    )
    return client


def _make_client(settings: Settings) -> redis.Redis:
    global _fake_server
    if settings.redis_url and settings.redis_url.startswith(SENTINEL_SCHEME):
        return _sentinel_client(settings, settings.redis_url)
    if settings.redis_url and settings.redis_url.startswith(CLUSTER_SCHEME):
        try:
            client = state_client(settings.redis_url, max_connections=MAX_CONNECTIONS, **cluster_options(settings))
        except RedisClusterException as exc:  # it connects (and fails) in its constructor: an unreachable Redis
            raise RedisConnectionError(str(exc)) from None
        _reached.add(_url_key(settings))
        return client
    if settings.redis_url:
        return redis.Redis.from_url(
            settings.redis_url, decode_responses=True, max_connections=MAX_CONNECTIONS, **client_options(settings)
        )
    try:
        import fakeredis
    except ImportError:  # a lean install for real Redis only
        raise MissingExtraError("embedded mode (STEPQ_REDIS_URL unset)", "embedded") from None
    if _fake_server is None:
        _fake_server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=_fake_server, decode_responses=True)
