"""Key names. Per-turn keys share a `{turn_id}` hash tag so a turn's keys live in one cluster slot."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def turn(self, turn_id: str) -> str:
        return f"{self.prefix}:turn:{{{turn_id}}}"

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
        ]

    def idempotency(self, agent: str, key: str) -> str:
        return f"{self.prefix}:idem:{agent}:{key}"

    def approval(self, approval_id: str) -> str:
        return f"{self.prefix}:approval:{approval_id}"

    def approval_reply(self, request_id: str) -> str:
        return f"{self.prefix}:approval-reply:{request_id}"

    @property
    def active(self) -> str:
        """ZSET of queued/running turns scored by last commit time (the sweeper's worklist)."""
        return f"{self.prefix}:active"

    @property
    def awaiting(self) -> str:
        """ZSET of parked turns scored by their earliest approval expiry."""
        return f"{self.prefix}:awaiting"

    @property
    def sweep_lock(self) -> str:
        return f"{self.prefix}:sweep-lock"

    @property
    def generated_secret(self) -> str:
        return f"{self.prefix}:approval-secret"
