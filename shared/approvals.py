"""Approval capabilities: an HMAC over (approval id, turn, tool call, tool name, args hash, expiry).

The token is `<key id>.<hex mac>`; the key id picks the secret, so old secrets kept
in `STEPQ_APPROVAL_OLD_SECRETS` still verify pending approvals after a rotation.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any


def canonical_args_hash(args: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of validated args: any change to the args changes it."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def key_id(secret: bytes) -> str:
    return hashlib.sha256(b"stepq-approval-key:" + secret).hexdigest()[:12]


@dataclass(frozen=True)
class ApprovalClaim:
    approval_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    args_hash: str
    expires_at: float

    def message(self) -> bytes:
        fields = [self.approval_id, self.turn_id, self.tool_call_id, self.tool_name, self.args_hash]
        return ("\x1f".join(fields) + f"\x1f{self.expires_at:.3f}").encode()


class ApprovalSigner:
    def __init__(self, current: bytes, old: list[bytes] | None = None) -> None:
        self.current = current
        self._by_kid = {key_id(s): s for s in [current, *(old or [])]}

    def sign(self, claim: ApprovalClaim) -> str:
        mac = hmac.new(self.current, claim.message(), hashlib.sha256).hexdigest()
        return f"{key_id(self.current)}.{mac}"

    def verify(self, claim: ApprovalClaim, token: str) -> bool:
        kid, _, mac = token.partition(".")
        secret = self._by_kid.get(kid)
        if secret is None or not mac:
            return False
        expected = hmac.new(secret, claim.message(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, mac)
