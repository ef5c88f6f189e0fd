"""Batches: many items through one agent, each a turn whose idempotency key comes from the batch,
the item's key and a hash of the item's content: re-running after an interruption re-uses finished
turns instead of re-billing, and an item whose content changed is a new turn (never the old answer).

Workers record each finished batch turn in the batch's counters and its `done` stream;
a runner anywhere follows that stream, and `stepq batch status` reads the counters.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stepq.models import TurnState

_BATCH_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


class BatchItem(BaseModel):
    """One input line: a key plus a prompt, messages, or an `input` value (sent as JSON text)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200)
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    input: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_payload(self) -> BatchItem:
        given = [x is not None for x in (self.prompt, self.messages, self.input)]
        if sum(given) != 1:
            raise ValueError("an item needs exactly one of prompt, messages or input")
        return self

    def content_hash(self) -> str:
        """What the item asks, hashed (everything but its key): equal hashes ask the same thing."""
        content = {"prompt": self.prompt, "messages": self.messages, "input": self.input, "metadata": self.metadata}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def prompt_text(self) -> str | None:
        if self.prompt is not None:
            return self.prompt
        if self.input is not None:
            return self.input if isinstance(self.input, str) else json.dumps(self.input, ensure_ascii=False)
        return None


def parse_item(line: str, line_no: int) -> BatchItem:
    """Parse one JSONL line; raises ValueError naming the line and the problem."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {line_no}: not JSON ({exc.msg})") from None
    if isinstance(raw, dict):
        raw.setdefault("key", f"line-{line_no}")
    return batch_item(raw, f"line {line_no}")


def batch_item(raw: Any, where: str) -> BatchItem:
    """One item (a JSONL line's object, or a dict given to `Client.submit_batch`); raises ValueError naming
    `where` (its line, its index) and the field at fault."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: an item must be a JSON object")
    try:
        return BatchItem.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(map(str, first["loc"])) or "item"
        raise ValueError(f"{where}: {field}: {first['msg'].removeprefix('Value error, ')}") from None


def derive_batch_id(agent: str, source: str) -> str:
    return "b-" + hashlib.sha256(f"{agent}\x1f{source}".encode()).hexdigest()[:16]


def check_batch_id(batch_id: str) -> str:
    if not _BATCH_ID.match(batch_id):
        raise ValueError("a batch id is 1-100 characters of letters, digits and _ . : -")
    return batch_id


def item_idempotency_key(batch_id: str, item: BatchItem) -> str:
    """The item's identity: its batch, its key and its content. An edited item gets a new turn."""
    key_hash = hashlib.sha256(item.key.encode()).hexdigest()[:32]
    return f"batch:{batch_id}:{key_hash}:{item.content_hash()}"


def result_line(item_key: str, state: TurnState, *, item_hash: str = "", reused: bool = False) -> dict[str, Any]:
    """The JSONL output record for one finished item; `reused`: the turn came from an earlier run."""
    return {
        "key": item_key,
        "item_hash": item_hash,
        "reused": reused,
        "status": state.status.value,
        "turn_id": state.turn_id,
        "object": state.object,
        "text": state.text if state.object is None else None,
        "finish_reason": state.finish_reason.value if state.finish_reason else None,
        "error": state.error,
        "usage": state.usage.model_dump(exclude_none=True),
    }
