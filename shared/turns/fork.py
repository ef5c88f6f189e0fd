"""Forking a turn from a step ("time travel"): a new turn whose transcript is the original's up to step n.

Step n of a turn is the model call that wrote its n-th assistant message (counting from 0), so the fork's
transcript is everything before that message: the input and steps 0..n-1, each step's tool results as they
were stored. The new turn's first step asks the model again from there; the tools of the earlier steps are
never run again (their results are in the transcript). The last user message may be replaced (`prompt`), the
loop tightened (`overrides`, as `submit(loop=...)`) and the model changed (`model`, as `submit(model=...)`),
under the same agent and policies as any submit. The new turn records `metadata.origin = {turn_id, step}`.
"""

from __future__ import annotations

from typing import Any

from stepq.errors import SubmitError, TurnNotFoundError
from stepq.fleet.runtime import Runtime
from stepq.models import AssistantMessage, Message, Policy, SystemMessage, TurnState, UserMessage
from stepq.store.listings import tenant_of
from stepq.turns.submit import LoopOverrides, create_turn

# metadata a fork does not inherit: it is not part of its original's batch or thread, and has its own origin
_NOT_INHERITED = ("batch_id", "thread_id", "origin", "batch_item")


def steps_of(messages: list[Message]) -> list[int]:
    """The index in `messages` of each step's assistant message, in step order."""
    return [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]


def fork_transcript(messages: list[Message], from_step: int, prompt: str | None) -> list[Message]:
    """The transcript step `from_step` was asked with, the last user message replaced by `prompt` if given."""
    starts = steps_of(messages)
    if isinstance(from_step, bool) or not isinstance(from_step, int) or not 0 <= from_step <= len(starts):
        raise SubmitError(
            f"from_step must be an integer from 0 to {len(starts)} (the turn has {len(starts)} recorded steps); "
            f"got {from_step!r}"
        )
    cut = starts[from_step] if from_step < len(starts) else len(messages)
    kept: list[Message] = [m for m in messages[:cut] if not isinstance(m, SystemMessage)]  # the agent: its own
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise SubmitError("prompt must be a non-empty string (the new last user message)")
        users = [i for i, m in enumerate(kept) if isinstance(m, UserMessage)]
        if not users:
            raise SubmitError(f"step {from_step} has no user message before it to replace with prompt")
        last = users[-1]
        original = kept[last]
        assert isinstance(original, UserMessage)
        kept[last] = original.model_copy(update={"content": prompt})
    return kept


def fork_turn(
    rt: Runtime,
    turn_id: str,
    *,
    from_step: int,
    prompt: str | None = None,
    overrides: LoopOverrides | dict[str, Any] | None = None,
    model: str | None = None,
    tenant: str | None = None,
    policy: Policy | dict[str, Any] | None = None,
) -> TurnState:
    """Store the fork of `turn_id` from `from_step` (not sent yet). With `tenant`, another tenant's turn is
    not found. Raises TurnNotFoundError or SubmitError (nothing stored)."""
    original = rt.turns.load(turn_id) if isinstance(turn_id, str) else None
    if original is None or (tenant is not None and tenant_of(original) != tenant):
        raise TurnNotFoundError(f"no turn {turn_id!r} (unknown, expired after its TTL, or not yours)")
    messages = fork_transcript(original.messages, from_step, prompt)
    metadata = {k: v for k, v in original.metadata.items() if k not in _NOT_INHERITED}
    metadata["origin"] = {"turn_id": original.turn_id, "step": from_step}
    state, _ = create_turn(
        rt,
        original.agent,
        messages=[m.model_dump(mode="json") for m in messages],
        metadata=metadata,
        features=list(original.features),
        model=model,
        loop=overrides,
        priority=original.priority,
        policy=policy if policy is not None else original.caller_policy,
    )
    return state
