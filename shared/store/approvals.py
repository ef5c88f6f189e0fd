"""Approval records and the atomic, once-only decision on them."""

from __future__ import annotations

import json
from typing import Any

import redis
from pydantic import BaseModel

from stepq.errors import ApprovalRefusal
from stepq.store.keys import Keys
from stepq.store.pipelines import queue_script

# KEYS: approval. ARGV: now, decision, reviewer, reason[, edited args JSON, their hash, their token].
# Returns {refusal code or '', the approval's status}.
_DECIDE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown', ''} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'cancelled' then return {'turn-not-waiting', status} end
if status ~= 'pending' then return {'not-pending', status} end
if tonumber(ARGV[1]) >= tonumber(redis.call('HGET', KEYS[1], 'expires_at')) then
  redis.call('HSET', KEYS[1], 'status', 'expired', 'decided_at', ARGV[1])
  return {'expired', 'expired'}
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'reviewer', ARGV[3], 'reason', ARGV[4], 'decided_at', ARGV[1])
if ARGV[5] then
  redis.call('HSET', KEYS[1], 'edited_args', ARGV[5], 'edited_args_hash', ARGV[6], 'edited_token', ARGV[7])
end
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


class ApprovalStore:
    def __init__(self, client: redis.Redis, keys: Keys, retention_s: int) -> None:
        self.client = client
        self.keys = keys
        self.retention_s = retention_s
        self._decide = client.register_script(_DECIDE)

    def create(self, record: ApprovalRecord) -> None:
        key = self.keys.approval(record.approval_id)
        fields = record.model_dump(exclude={"edited_args", "edited_args_hash", "edited_token"})
        fields["args"] = json.dumps(record.args)
        pipe = self.client.pipeline()
        pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(key, int(record.expires_at - _now()) + self.retention_s)
        pipe.execute()

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
    ) -> tuple[ApprovalRefusal | None, str]:
        """(None, new status) when this call's decision was recorded; otherwise (why not, the approval's
        status). Atomic: the first decision wins. `edit` (args, hash, token) is recorded with an approval."""
        args = [f"{now:.6f}", "approved" if approved else "denied", reviewer, reason]
        if edit is not None:
            args += [json.dumps(edit[0]), edit[1], edit[2]]
        refusal, status = self._decide(keys=[self.keys.approval(approval_id)], args=args)
        return (ApprovalRefusal(refusal) if refusal else None), str(status)

    def cancel(self, approval_ids: list[str], now: float, reason: str) -> None:
        """Resolve still-pending approvals as cancelled: their turn ended (cancelled or finished) first. A later
        decision on one is refused as `turn-not-waiting`; one decided before keeps its decision."""
        pipe = self.client.pipeline(transaction=False)
        for approval_id in approval_ids:
            queue_script(pipe, self._decide, [self.keys.approval(approval_id)], [f"{now:.6f}", "cancelled", "", reason])
        pipe.execute()

    def expire(self, approval_id: str, now: float) -> None:
        """Resolve a pending approval past its expiry as expired (a denial)."""
        self._decide(keys=[self.keys.approval(approval_id)], args=[f"{now:.6f}", "expired", "", ""])


def _now() -> float:
    import time

    return time.time()
