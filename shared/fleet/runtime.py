"""The per-process bundle of settings, Redis stores and registries that every layer uses.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from dataclasses import dataclass, field

import redis

from stepq.agents.registry import AgentRegistry, registry
from stepq.approvals import ApprovalSigner
from stepq.config.settings import GENERATED_SECRET_NOTICE, Settings, get_settings
from stepq.fleet.ratelimit import RateLimiter
from stepq.store.approvals import ApprovalStore
from stepq.store.batch_runs import BatchRunStore
from stepq.store.connection import get_redis
from stepq.store.events import EventLog
from stepq.store.keys import Keys
from stepq.store.leases import LeaseManager
from stepq.store.listings import ListingStore
from stepq.store.policies import PolicyStore
from stepq.store.threads import ThreadStore
from stepq.store.tool_results import ToolResultStore
from stepq.store.turns import TurnStore

log = logging.getLogger("stepq")


@dataclass
class Runtime:
    settings: Settings
    redis: redis.Redis
    keys: Keys
    turns: TurnStore
    events: EventLog
    leases: LeaseManager
    tool_results: ToolResultStore
    approvals: ApprovalStore
    threads: ThreadStore
    listings: ListingStore
    policies: PolicyStore
    batches: BatchRunStore
    agents: AgentRegistry
    limiter: RateLimiter
    _signer: ApprovalSigner | None = field(default=None, repr=False)

    @classmethod
    def build(cls, settings: Settings) -> Runtime:
        client = get_redis(settings)
        keys = Keys(settings.state_prefix, settings.redis_index_shards)
        agents = registry()
        if not settings.embedded or settings.agent_modules:
            agents.load_modules(settings.agent_modules)
        # on a cluster the sweeper's lists are in other slots than the turns: updated around the scripts
        separate = settings.redis_cluster
        listings = ListingStore(client, keys, settings.event_ttl_s, settings.thread_ttl_s, separate)
        turns = TurnStore(client, keys, settings.event_ttl_s, separate_indexes=separate, listings=listings)
        return cls(
            settings=settings,
            redis=client,
            keys=keys,
            turns=turns,
            events=EventLog(client, keys, settings.event_maxlen),
            leases=LeaseManager(client, keys, settings.lease_ttl_s, settings.cancel_poll_s),
            tool_results=ToolResultStore(client, keys, turns.indexes),
            approvals=ApprovalStore(client, keys, settings.event_ttl_s, listings),
            threads=ThreadStore(client, keys, settings.thread_ttl_s, turns.indexes, listings),
            listings=listings,
            policies=PolicyStore(client, keys),
            batches=BatchRunStore(client, keys, settings.event_ttl_s),
            agents=agents,
            limiter=RateLimiter(client, keys, hold_ttl_s=max(settings.lease_ttl_s * 4, 300.0)),
        )

    @property
    def signer(self) -> ApprovalSigner:
        """HMAC signer from STEPQ_APPROVAL_SECRET; without one, a random secret shared through Redis."""
        if self._signer is None:
            s = self.settings
            if s.approval_secret is not None:
                current = s.approval_secret.get_secret_value().encode()
            else:
                self.redis.set(self.keys.generated_secret, secrets.token_hex(32), nx=True)
                current = str(self.redis.get(self.keys.generated_secret)).encode()
                if not s.embedded:
                    log.warning(GENERATED_SECRET_NOTICE)
            old = [x.get_secret_value().encode() for x in s.approval_old_secrets]
            self._signer = ApprovalSigner(current, old)
        return self._signer


_lock = threading.Lock()
_runtimes: dict[str, Runtime] = {}
_by_object: dict[int, tuple[Settings, Runtime]] = {}


def _cache_key(settings: Settings) -> str:
    """By content (an id() could be reused by a later Settings), secrets included: their dump is masked."""
    secrets_in = [settings.approval_secret, *settings.approval_old_secrets]
    digest = hashlib.sha256("\x1f".join(s.get_secret_value() if s else "" for s in secrets_in).encode()).hexdigest()
    return settings.model_dump_json() + digest


def get_runtime(settings: Settings | None = None) -> Runtime:
    """The runtime for these settings (default: the environment's), built once per process."""
    settings = settings or get_settings()
    known = _by_object.get(id(settings))
    if known is not None and known[0] is settings:  # the hot path: the same Settings object again
        return known[1]
    with _lock:
        key = _cache_key(settings)
        rt = _runtimes.get(key)
        if rt is None:
            rt = Runtime.build(settings)
            _runtimes[key] = rt
        _by_object[id(settings)] = (settings, rt)  # holds `settings`, so its id cannot be reused
        return rt
