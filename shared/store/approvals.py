"""Approval records and the atomic, once-only decision on them."""

from __future__ import annotations

import json
from typing import Any

import redis
from pydantic import BaseModel
from redis.commands.core import Script

from stepq.errors import ApprovalRefusal
from stepq.store.keys import Keys
from stepq.store.listings import ListingStore
from stepq.store.pipelines import queue_script

# KEYS: approval[, the tenant's approval listings (pending, decided, leave): single Redis only, see
# stepq.store.listings]. ARGV: now, decision, reviewer, reason[, edited args JSON, their hash, their token].
# Returns {refusal code or '', the approval's status}.
_DECIDE = """
local function listed()  -- decided now: from the tenant's pending listing to its decided one
  if not KEYS[2] then return end
  local id = string.match(KEYS[1], '([^:]+)$')
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZADD', KEYS[3], ARGV[1], id)
  redis.call('ZADD', KEYS[4], 'NX', redis.call('HGET', KEYS[1], 'expires_at'), id)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown', ''} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'cancelled' then return {'turn-not-waiting', status} end
if status ~= 'pending' then return {'not-pending', status} end
if tonumber(ARGV[1]) >= tonumber(redis.call('HGET', KEYS[1], 'expires_at')) then
  redis.call('HSET', KEYS[1], 'status', 'expired', 'decided_at', ARGV[1])
  listed()
  return {'expired', 'expired'}
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'reviewer', ARGV[3], 'reason', ARGV[4], 'decided_at', ARGV[1])
if ARGV[5] then
  redis.call('HSET', KEYS[1], 'edited_args', ARGV[5], 'edited_args_hash', ARGV[6], 'edited_token', ARGV[7])
end
listed()
return {'', ARGV[2]}
"""


class ApprovalRecord(BaseModel):
    approval_id: str
    turn_id: str
    step: int
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    args_hash: str
    expires_at: float
    status: str = "pending"  # pending | approved | denied | expired | cancelled (its turn ended first)
    reviewer: str = ""
    reason: str = ""
    # the signed capability: kept here, never in an event; approve paths send it on behalf of a caller
    token: str = ""
    # an editable tool approved with other arguments: those (validated), their hash, and the worker's HMAC
    # binding them to this approval; the step runs the call with them only if that binding verifies
    edited_args: dict[str, Any] | None = None
    edited_args_hash: str = ""
    edited_token: str = ""
    # for the listings (stepq.store.listings): whose it is and when it was asked; '' / 0 on older records
    tenant: str = ""
    agent: str = ""
    created_at: float = 0.0
    decided_at: float = 0.0


class ApprovalStore:
    def __init__(self, client: redis.Redis, keys: Keys, retention_s: int, listings: ListingStore | None = None) -> None:
        self.client = client
        self.keys = keys
        self.retention_s = retention_s
        self.listings = listings or ListingStore(client, keys, retention_s, retention_s, False)
        self._decide = client.register_script(_DECIDE)

    def create(self, record: ApprovalRecord, listed: bool = True) -> None:
        """Store the approval; `listed`: and list it as pending for its tenant now (else the caller sends
        `listing_write` itself, e.g. with the step's commit)."""
        key = self.keys.approval(record.approval_id)
        if not record.created_at:
            record.created_at = _now()
        fields = record.model_dump(exclude={"edited_args", "edited_args_hash", "edited_token", "decided_at"})
        fields["args"] = json.dumps(record.args)
        pipe = self.client.pipeline()
        pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(key, self._ttl(record))
        pipe.execute()
        if listed:
            script, keys, args = self.listing_write(record)
            script(keys=keys, args=args)

    def _ttl(self, record: ApprovalRecord) -> int:
        return int(record.expires_at - record.created_at) + self.retention_s

    def listing_write(self, record: ApprovalRecord) -> tuple[Script, list[str], list[Any]]:
        """The tenant's pending listing of a new approval, as a script call (its own slot on a cluster)."""
        leave = record.created_at + self._ttl(record)
        keys = self.listings.approval_keys(record.tenant)
        args = self.listings.approval_args(record.approval_id, True, record.created_at, leave, record.created_at)
        return self.listings.approval_script, keys, args

    def get(self, approval_id: str) -> ApprovalRecord | None:
        raw = self.client.hgetall(self.keys.approval(approval_id))
        if not raw:
            return None
        raw["args"] = json.loads(raw["args"])
        if raw.get("edited_args"):
            raw["edited_args"] = json.loads(raw["edited_args"])
        return ApprovalRecord.model_validate(raw)

    def get_many(self, approval_ids: list[str]) -> dict[str, ApprovalRecord]:
        return {aid: rec for aid in approval_ids if (rec := self.get(aid)) is not None}

    def decide(
        self,
        approval_id: str,
        approved: bool,
        reviewer: str,
        reason: str,
        now: float,
        edit: tuple[dict[str, Any], str, str] | None = None,
        tenant: str = "",
    ) -> tuple[ApprovalRefusal | None, str]:
        """(None, new status) when this call's decision was recorded; otherwise (why not, the approval's
        status). Atomic: the first decision wins. `edit` (args, hash, token) is recorded with an approval."""
        args = [f"{now:.6f}", "approved" if approved else "denied", reviewer, reason]
        if edit is not None:
            args += [json.dumps(edit[0]), edit[1], edit[2]]
        refusal, status = self._decide(keys=self._decide_keys(approval_id, tenant), args=args)
        if refusal in ("", "expired"):
            self._listed_after(approval_id, tenant, now)
        return (ApprovalRefusal(refusal) if refusal else None), str(status)

    def _decide_keys(self, approval_id: str, tenant: str) -> list[str]:
        """The decision script's keys: on a single Redis with the tenant's listings, which it moves itself."""
        own = [self.keys.approval(approval_id)]
        return own if self.listings.separate else own + self.listings.approval_keys(tenant)

    def _listed_after(self, approval_id: str, tenant: str, now: float) -> None:
        """On a cluster: list a decision right after the script recorded it (the listings' slot is another)."""
        if self.listings.separate:
            leave = now + self.retention_s
            self.listings.approval_script(
                keys=self.listings.approval_keys(tenant),
                args=self.listings.approval_args(approval_id, False, now, leave, now),
            )

    def cancel(self, approval_ids: list[str], now: float, reason: str, tenant: str = "") -> None:
        """Resolve still-pending approvals as cancelled: their turn ended (cancelled or finished) first. A later
        decision on one is refused as `turn-not-waiting`; one decided before keeps its decision."""
        pipe = self.client.pipeline(transaction=False)
        for approval_id in approval_ids:
            keys = self._decide_keys(approval_id, tenant)
            queue_script(pipe, self._decide, keys, [f"{now:.6f}", "cancelled", "", reason])
        replies = pipe.execute()
        for approval_id, (refusal, _) in zip(approval_ids, replies, strict=True):
            if not refusal:
                self._listed_after(approval_id, tenant, now)

    def expire(self, approval_id: str, now: float, tenant: str = "") -> None:
        """Resolve a pending approval past its expiry as expired (a denial)."""
        refusal, _ = self._decide(keys=self._decide_keys(approval_id, tenant), args=[f"{now:.6f}", "expired", "", ""])
        if refusal in ("", "expired"):
            self._listed_after(approval_id, tenant, now)


def _now() -> float:
    import time

    return time.time()
