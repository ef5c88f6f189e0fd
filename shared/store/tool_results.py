"""Tool results stored by (turn_id, tool_call_id) before the loop moves on: a re-run step reuses them."""

from __future__ import annotations

from typing import Any

import redis
from redis.commands.core import Script

from stepq.models import ToolResult
from stepq.store.keys import Keys

_PUT = "return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])"


class ToolResultStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._put = client.register_script(_PUT)

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

    def put_write(self, turn_id: str, result: ToolResult) -> tuple[Script, list[str], list[Any]]:
        """The write of `put` as a script call, to ride in a step's next round trip (first stored wins)."""
        return self._put, [self.keys.tool_results(turn_id)], [result.tool_call_id, result.model_dump_json()]
