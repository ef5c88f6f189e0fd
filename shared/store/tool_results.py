"""Tool results stored by (turn_id, tool_call_id) before the loop moves on: a re-run step reuses them."""

from __future__ import annotations

import redis

from shared.models import ToolResult
from shared.store.keys import Keys


class ToolResultStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def get_many(self, turn_id: str, call_ids: list[str]) -> dict[str, ToolResult]:
        if not call_ids:
            return {}
        raw = self.client.hmget(self.keys.tool_results(turn_id), call_ids)
        return {cid: ToolResult.model_validate_json(v) for cid, v in zip(call_ids, raw, strict=True) if v}

    def put(self, turn_id: str, result: ToolResult) -> ToolResult:
        """Store a result unless one is already there; returns the one that is stored."""
        key = self.keys.tool_results(turn_id)
        if self.client.hsetnx(key, result.tool_call_id, result.model_dump_json()):
            return result
        existing = self.client.hget(key, result.tool_call_id)
        return ToolResult.model_validate_json(existing) if existing else result
