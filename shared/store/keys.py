"""Every Redis key stepq reads or writes is named here, and nowhere else.

Keys carry Redis Cluster hash tags (`{...}`: only the tag picks a key's slot), chosen so that every Lua
script and transaction touches one slot while a deployment's keys spread over the whole cluster:

- A turn's keys share the tag of its *home*: 8 hex characters that stepq puts in the ids it makes
  (`turn_<home><24 random hex>`). A plain turn gets a random home; a thread's turns get their thread's
  home and an idempotent submit gets a home hashed from its agent and key, so the scripts that store a
  thread turn or check an idempotency key stay in one slot. An approval's id carries its turn's home.
- The sweeper's worklists (`active`, `awaiting`) are split into `index_shards` shards; a turn belongs to
  shard `crc32(turn_id) % index_shards`, and shard n of both lists shares one tag.
- A batch's keys share a `{batch_id}` tag, a rate-limit scope's a `{scope}` tag, the tenant policies'
  one `{<prefix>:policy}` tag, the provider-batch queues and batches one `{<prefix>:pbatch}` tag.
- A tenant's listings (turns, approvals, threads: stepq.store.listings) share one `{<prefix>:ls:<tenant hash>}`
  tag.
- The few fleet-wide keys (worker heartbeats, the sweep lock, the pending-approvals gauge, the set of
  driven batches) are single keys that no script combines with others.

On a single Redis the tags are just characters of the names. Celery's own broker keys are named by
kombu; the ones stepq reads are spelled here too.
"""

from __future__ import annotations

import functools
import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import NamedTuple

# kombu's Redis transport keeps a queue with priorities as lists `queue`, `queue\x06\x163`, `…6`, `…9`
_KOMBU_PRIORITY_SEP = "\x06\x16"
_KOMBU_PRIORITY_STEPS = (3, 6, 9)
# ids stepq makes: a kind, '_', then 32 hex of which the first 8 name the home (the cluster hash tag)
_MADE_ID = re.compile(r"^(?:turn|thr|apv)_([0-9a-f]{8})[0-9a-f]{24}$")
DEFAULT_INDEX_SHARDS = 16


@functools.lru_cache(maxsize=4096)  # a step names its turn's keys ~30 times: one regex match per turn, not per key
def home(object_id: str) -> str:
    """The hash tag of an id: its embedded home for ids stepq made, else a hash (any string gets one slot)."""
    made = _MADE_ID.match(object_id)
    return made.group(1) if made else hashlib.sha256(object_id.encode()).hexdigest()[:8]


def idempotency_home(agent: str, key: str) -> str:
    """The home of the turn an idempotency key names: fixed by the key, so checking the key and storing the
    turn are one script in one slot."""
    return hashlib.sha256(f"{agent}\x1f{key}".encode()).hexdigest()[:8]


class RateLimitKeys(NamedTuple):
    """One provider/model scope's limiter state (the order is the Lua script's KEYS order)."""

    requests: str  # ZSET of request holders in the sliding window
    tokens: str  # ZSET of "<tokens>:<holder>" charges in the window
    token_sum: str  # running sum of `tokens`
    holders: str  # ZSET of concurrency holders scored by expiry
    penalty: str  # the fleet-wide factor after a 429
    paused_until: str  # the provider's retry-after, as a timestamp


@functools.lru_cache(maxsize=4096)
def _tenant_digest(tenant: str) -> str:
    """A tenant's listing hash tag: a commit that moves a turn's listing names eleven of its keys."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Keys:
    prefix: str
    index_shards: int = DEFAULT_INDEX_SHARDS

    def turn(self, turn_id: str) -> str:
        return f"{self.prefix}:turn:{{{home(turn_id)}}}:{turn_id}"

    def version(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:ver"

    def messages(self, turn_id: str) -> str:
        """The transcript: a list of message JSON, append-only."""
        return f"{self.turn(turn_id)}:messages"

    def trace(self, turn_id: str) -> str:
        """The loop trace: a list of step-trace JSON, append-only."""
        return f"{self.turn(turn_id)}:trace"

    def events(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:events"

    def seq(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:seq"

    def channel(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:ch"

    def finished(self, turn_id: str) -> str:
        """A pub/sub channel with one message, as `turn-finish` is written: what `Client.wait` follows, so a
        waiter is not woken by every event of the turn."""
        return f"{self.turn(turn_id)}:done"

    def emitted(self, turn_id: str) -> str:
        """The step whose content reached subscribers but was not committed yet (for step-reset)."""
        return f"{self.turn(turn_id)}:emitted"

    def lease(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:lease"

    def started(self, turn_id: str) -> str:
        """The step a delivery started and has not finished: present with no lease means it crashed."""
        return f"{self.turn(turn_id)}:started"

    def checkpoint(self, turn_id: str) -> str:
        """The model's answer for the step in flight, kept from before its tools run until it commits."""
        return f"{self.turn(turn_id)}:checkpoint"

    def cancel(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:cancel"

    def tool_results(self, turn_id: str) -> str:
        return f"{self.turn(turn_id)}:tools"

    def dispatched(self, turn_id: str) -> str:
        """Set once the producer has sent the turn's first step (only for turns with an idempotency key)."""
        return f"{self.turn(turn_id)}:sent"

    def sent_step(self, turn_id: str) -> str:
        """The last step whose run_step message is known to have been sent (the sweeper's lost-message check)."""
        return f"{self.turn(turn_id)}:sent-step"

    def attachments(self, turn_id: str) -> str:
        """HASH attachment id (the sha256 of the bytes) -> base64 of each file the turn's messages reference."""
        return f"{self.turn(turn_id)}:files"

    def per_turn(self, turn_id: str) -> list[str]:
        """Every key a turn owns, for expiry when it ends."""
        return [
            self.turn(turn_id),
            self.version(turn_id),
            self.messages(turn_id),
            self.trace(turn_id),
            self.events(turn_id),
            self.seq(turn_id),
            self.emitted(turn_id),
            self.started(turn_id),
            self.checkpoint(turn_id),
            self.cancel(turn_id),
            self.tool_results(turn_id),
            self.dispatched(turn_id),
            self.sent_step(turn_id),
            self.attachments(turn_id),
            self.pbatch_request(turn_id),
            self.pbatch_outcome(turn_id),
        ]

    def absent(self, turn_id: str) -> str:
        """A name no command ever writes, in the turn's slot: what a script gets for an optional key the caller
        has none of (a real name in the script's slot, where '' would hash to a slot of its own on a cluster)."""
        return f"{self.turn(turn_id)}:absent"

    def idempotency(self, agent: str, key: str) -> str:
        return f"{self.prefix}:idem:{{{idempotency_home(agent, key)}}}:{agent}:{key}"

    def approval(self, approval_id: str) -> str:
        """HASH of one approval, in its turn's slot (the approval id carries the turn's home)."""
        return f"{self.prefix}:approval:{{{home(approval_id)}}}:{approval_id}"

    def approval_reply(self, request_id: str) -> str:
        return f"{self.prefix}:approval-reply:{request_id}"

    def shard(self, turn_id: str) -> int:
        """The index shard a turn belongs to (stable across processes and versions: crc32, not hash())."""
        return zlib.crc32(turn_id.encode()) % self.index_shards

    def active(self, shard: int) -> str:
        """ZSET of queued/running turns scored by last commit time: one shard of the sweeper's worklist."""
        return f"{self.prefix}:active:{{{self.prefix}:ix:{shard}}}"

    def awaiting(self, shard: int) -> str:
        """ZSET of parked turns scored by their earliest approval expiry (one shard, in the slot of `active`'s)."""
        return f"{self.prefix}:awaiting:{{{self.prefix}:ix:{shard}}}"

    @property
    def sweep_lock(self) -> str:
        return f"{self.prefix}:sweep-lock"

    @property
    def broker_reconnected(self) -> str:
        """When a worker's consumer last reconnected to the broker: the sweeper re-sends what was stranded."""
        return f"{self.prefix}:broker-reconnected"

    @property
    def generated_secret(self) -> str:
        return f"{self.prefix}:approval-secret"

    # ----------------------------------------------------------------- fleet-wide

    @property
    def workers(self) -> str:
        """ZSET of worker name -> time of its last heartbeat."""
        return f"{self.prefix}:workers"

    @property
    def workers_info(self) -> str:
        """HASH of worker name -> JSON of what it said about itself in its last heartbeat."""
        return f"{self.prefix}:workers:info"

    @property
    def approvals_pending(self) -> str:
        """ZSET of approval id -> expiry, for the pending-approvals gauge."""
        return f"{self.prefix}:approvals-pending"

    def rate_limit(self, scope: str) -> RateLimitKeys:
        base = f"{self.prefix}:rl:{{{scope}}}"
        return RateLimitKeys(
            f"{base}:req", f"{base}:tok", f"{base}:toksum", f"{base}:hold", f"{base}:penalty", f"{base}:paused"
        )

    # ----------------------------------------------------------------- tenant policies

    def policy(self, tenant: str) -> str:
        """HASH of a tenant's policy: scope (`*`, a module, an agent id) -> Policy JSON. The policy keys share
        one hash tag: a policy write updates the hash, the version and the tenants set in one script."""
        return f"{self.prefix}:policy:{{{self.prefix}:policy}}:tenant:{tenant}"

    @property
    def policy_version(self) -> str:
        """STRING counter bumped by every tenant policy change; each step reads it with its lease."""
        return f"{self.prefix}:policy:{{{self.prefix}:policy}}:version"

    @property
    def policy_tenants(self) -> str:
        """SET of tenants that have a policy (what `stepq policy show` lists)."""
        return f"{self.prefix}:policy:{{{self.prefix}:policy}}:tenants"

    def credentials(self, tenant: str) -> str:
        """HASH of a tenant's provider credentials: provider -> sealed record JSON (never a key in clear). In the
        policies' slot: a change bumps `policy_version`, which every step already reads with its lease."""
        return f"{self.prefix}:policy:{{{self.prefix}:policy}}:credentials:{tenant}"

    def quota(self, tenant: str, scope: str, window_s: float, index: int) -> str:
        """HASH of one tenant's usage (`tokens`, `cost`) in one window of one quota; a tenant's counters share a
        `{<prefix>:quota:<tenant>}` tag (one slot), and each expires a window after its own ends."""
        return f"{self.prefix}:quota:{{{self.prefix}:quota:{tenant}}}:{scope}:{window_s:g}:{index}"

    # ----------------------------------------------------------------- listings

    def listing(self, tenant: str, name: str) -> str:
        """One of a tenant's listing keys (stepq.store.listings). They share one hash tag per tenant (hashed:
        any characters, fixed length), so a script updates or pages them all in one slot."""
        return f"{self.prefix}:ls:{{{self.prefix}:ls:{_tenant_digest(tenant)}}}:{name}"

    # ----------------------------------------------------------------- threads

    def thread(self, thread_id: str) -> str:
        """HASH of a thread: agent, tenant, metadata, the turn it runs now and the one that ran before
        (in its turns' slot: they share its home)."""
        return f"{self.prefix}:thread:{{{home(thread_id)}}}:{thread_id}"

    def thread_messages(self, thread_id: str) -> str:
        """The thread's transcript: a list of message JSON, replaced from each turn that finishes."""
        return f"{self.thread(thread_id)}:messages"

    def thread_files(self, thread_id: str) -> str:
        """HASH attachment id -> base64 of the files the thread's turns were given (any later turn reads them)."""
        return f"{self.thread(thread_id)}:files"

    def thread_turns(self, thread_id: str) -> str:
        """Every turn of the thread, oldest first."""
        return f"{self.thread(thread_id)}:turns"

    def thread_queue(self, thread_id: str) -> str:
        """Turns waiting for the running one to finish (double-texting `enqueue` / `interrupt`)."""
        return f"{self.thread(thread_id)}:queue"

    def thread_input(self, turn_id: str) -> str:
        """A waiting thread turn's own new messages, until the thread's transcript is put in front of them."""
        return f"{self.turn(turn_id)}:thread-input"

    def chat(self, tenant: str, chat_id: str) -> str:
        """STRING: the thread a chat UI's conversation id names. Clients choose chat ids, so the key is per
        tenant (hashed: any characters, fixed length) and two tenants' equal ids never meet."""
        digest = hashlib.sha256(f"{tenant}\x1f{chat_id}".encode()).hexdigest()
        return f"{self.prefix}:chat:{digest}"

    # ----------------------------------------------------------------- batches

    def batch(self, batch_id: str) -> str:
        """HASH of a batch's agent, total and finished/failed/token counters."""
        return f"{self.prefix}:batch:{{{batch_id}}}"

    def batch_created(self, batch_id: str) -> str:
        """SET of the batch's turn ids already counted in its `created` counter (a repeat counts once)."""
        return f"{self.batch(batch_id)}:created"

    def batch_done(self, batch_id: str) -> str:
        """STREAM of the batch's finished turns, which a runner anywhere follows."""
        return f"{self.batch(batch_id)}:done"

    def batch_input(self, batch_id: str) -> str:
        """LIST of a submitted batch's items (compact JSON, input order), which the batch driver submits."""
        return f"{self.batch(batch_id)}:input"

    def batch_inflight(self, batch_id: str) -> str:
        """HASH turn id -> JSON [index, item key, item hash] of the batch's turns still running."""
        return f"{self.batch(batch_id)}:inflight"

    def batch_results(self, batch_id: str) -> str:
        """HASH item key -> result line (JSON) of a driven batch: one field per item, written once."""
        return f"{self.batch(batch_id)}:results"

    def batch_lock(self, batch_id: str) -> str:
        """STRING: the token of the worker driving the batch right now (expires if it dies)."""
        return f"{self.batch(batch_id)}:lock"

    def batch_wake(self, batch_id: str) -> str:
        """STRING flag: the batch has news (a turn finished) for its driver's next pass."""
        return f"{self.batch(batch_id)}:wake"

    def batch_active(self) -> str:
        """SET of driven batches not finished yet, which the periodic tick drives."""
        return f"{self.prefix}:batches:active"

    # ----------------------------------------------------------------- provider batch APIs

    def pbatch_request(self, turn_id: str) -> str:
        """STRING: the turn's step request waiting in (or sent to) a provider batch, as JSON with its custom id."""
        return f"{self.turn(turn_id)}:pbatch"

    def pbatch_outcome(self, turn_id: str) -> str:
        """STRING: the provider batch's answer for the turn's request (custom id, result or error), as JSON."""
        return f"{self.turn(turn_id)}:pbatch-outcome"

    @property
    def pbatch_tag(self) -> str:
        """The provider-batch keys below share one hash tag: the tick takes requests into a batch in one script."""
        return f"{self.prefix}:pbatch:{{{self.prefix}:pbatch}}"

    def pbatch_pending(self, group: str) -> str:
        """ZSET of turn ids whose request waits for the next provider batch of `group` (provider/model)."""
        return f"{self.pbatch_tag}:pending:{group}"

    @property
    def pbatch_groups(self) -> str:
        """SET of groups (provider/model) with requests waiting to be sent."""
        return f"{self.pbatch_tag}:groups"

    def pbatch_batch(self, local_id: str) -> str:
        """HASH of one provider batch: group, provider id, state, members (JSON), created and deadline times."""
        return f"{self.pbatch_tag}:batch:{local_id}"

    @property
    def pbatch_open(self) -> str:
        """SET of provider batches sent (or being sent) whose results are not collected yet."""
        return f"{self.pbatch_tag}:open"

    @property
    def pbatch_lock(self) -> str:
        """STRING: the flush-and-poll tick's lock (one tick at a time across the fleet)."""
        return f"{self.pbatch_tag}:lock"

    # ----------------------------------------------------------------- the broker (Celery on Redis)

    @property
    def broker_prefix(self) -> str:
        """Celery's `global_keyprefix`: the broker's keys live under the same prefix as stepq's."""
        return f"{self.prefix}:"

    @staticmethod
    def broker_queue_lists(global_keyprefix: str, queue: str) -> list[str]:
        """The Redis lists holding one Celery queue's messages, one per priority step."""
        base = f"{global_keyprefix}{queue}"
        return [base, *(f"{base}{_KOMBU_PRIORITY_SEP}{pri}" for pri in _KOMBU_PRIORITY_STEPS)]
