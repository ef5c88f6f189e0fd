"""Tool results stored by (turn_id, tool_call_id) before the loop moves on: a re-run step reuses them.

Results of client-side tool calls (`submit_client`) are accepted once: one Lua script reads the open calls
from the parked step in the turn's own state and checks and stores every result in the same snapshot, so a
result for a call the turn does not wait for, a call already answered (a concurrent submit won), a call left
out, or a turn that stopped waiting (finished, cancelled, expired) is refused with nothing written.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.commands.core import Script

from stepq.models import ToolResult
from stepq.store.indexes import ACTIVE, SweepIndexes
from stepq.store.keys import Keys

_PUT = "return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])"

# KEYS: turn, tool results, the turn's `active` shard, the turn's `absent` key (KEYS[3] is it on a cluster: the
# shard is in another slot, listed around the script). ARGV: now, turn id, then call id / result JSON pairs.
# Returns {'' } when stored, else {refusal code, call ids...}.
_SUBMIT = """
local raw = redis.call('GET', KEYS[1])
if not raw then return {'turn-not-waiting'} end
local state = cjson.decode(raw)
if state.status ~= 'awaiting_tool_results' and state.status ~= 'awaiting_approval' then
  return {'turn-not-waiting'}
end
local parked = state.parked
if parked == nil or parked == cjson.null or parked.client_calls == nil or #parked.client_calls == 0 then
  return {'turn-not-waiting'}
end
local open = {}
for _, call in ipairs(parked.client_calls) do open[call.tool_call_id] = call end
if tonumber(ARGV[1]) >= tonumber(parked.client_calls[1].expires_at) then return {'expired'} end
local given, unknown, answered = {}, {}, {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  given[id] = true
  if open[id] == nil then
    table.insert(unknown, id)
  elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
    table.insert(answered, id)
  end
end
if #unknown > 0 then return {'unknown-call', unpack(unknown)} end
if #answered > 0 then return {'already-answered', unpack(answered)} end
local missing = {}
for _, call in ipairs(parked.client_calls) do
  if not given[call.tool_call_id] then table.insert(missing, call.tool_call_id) end
end
if #missing > 0 then return {'missing-results', unpack(missing)} end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
-- owed a resume from now on: the sweeper watches it
if KEYS[3] ~= KEYS[4] then redis.call('ZADD', KEYS[3], ARGV[1], ARGV[2]) end
return {''}
"""


class ToolResultStore:
    def __init__(self, client: redis.Redis, keys: Keys, indexes: SweepIndexes) -> None:
        self.client = client
        self.keys = keys
        self._put = client.register_script(_PUT)
        self._submit = client.register_script(_SUBMIT)
        self.indexes = indexes

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

    def submit_client(self, turn_id: str, results: dict[str, str], now: float) -> tuple[str, list[str]]:
        """Store every result (call id -> ToolResult JSON) or none: ('', []) when stored, else (refusal code,
        the call ids concerned)."""
        args: list[str] = [f"{now:.6f}", turn_id]
        for call_id, encoded in results.items():
            args += [call_id, encoded]
        k = self.keys
        absent = k.absent(turn_id)
        if self.indexes.separate:
            # owed a resume once stored: on the sweeper's list first, so a crash next leaves it watched (if the
            # results are refused, the sweeper drops the entry when it finds the turn still parked)
            self.indexes.add(ACTIVE, turn_id, now)
            active = absent
        else:
            active = self.indexes.key(ACTIVE, turn_id)
        reply = self._submit(keys=[k.turn(turn_id), k.tool_results(turn_id), active, absent], args=args)
        code, *ids = [str(x) for x in reply]
        return code, ids
