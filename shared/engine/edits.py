"""Approving a gated call with edited arguments (tools declared `editable=True`).

An approval binds the SHA-256 of the call's validated arguments under an HMAC. A reviewer who changes the
arguments needs a new binding: the `approve` task re-validates the edit against the tool's schema, hashes the
result and signs a claim over the new hash (`edited_binding`), recorded with the decision in the same atomic
script. When the step resumes, it runs the call with the edited arguments only if the original binding still
matches the model's call, the edited arguments still hash to the recorded hash, that hash's signature
verifies, and the arguments validate again (`verified_edit`); anything else is a refusal the model reads.
"""

from __future__ import annotations

from typing import Any

from stepq.agents.tools import ToolDefinition
from stepq.approvals import ApprovalClaim, ApprovalSigner, canonical_args_hash
from stepq.errors import ApprovalError, ApprovalRefusal, ToolArgumentError
from stepq.models import AssistantMessage, ToolCall
from stepq.store.approvals import ApprovalRecord


def _claim(record: ApprovalRecord, args_hash: str) -> ApprovalClaim:
    return ApprovalClaim(
        record.approval_id, record.turn_id, record.tool_call_id, record.tool_name, args_hash, record.expires_at
    )


def edited_binding(
    signer: ApprovalSigner,
    record: ApprovalRecord,
    args: dict[str, Any],
    approved: bool,
    definition: ToolDefinition | None,
) -> tuple[dict[str, Any], str, str]:
    """(validated args, their hash, the signed binding) for an approval with edited arguments; ApprovalError
    `changed-args` when the tool takes no edits (or the decision is a denial), `invalid-args` when the edit
    does not match the tool's schema. `definition`: the tool the turn's agent runs under the record's name."""
    if not approved or definition is None or not definition.editable:
        why = "a denial carries no arguments" if not approved else f"tool {record.tool_name} is not editable"
        raise ApprovalError(
            ApprovalRefusal.CHANGED_ARGS,
            f"approval {record.approval_id}: the arguments differ from the ones requested ({why})",
        )
    try:
        validated = definition.validate(dict(args))
    except ToolArgumentError as exc:
        raise ApprovalError(
            ApprovalRefusal.INVALID_ARGS,
            f"approval {record.approval_id}: the edited arguments do not match {record.tool_name}'s schema: {exc}",
        ) from None
    args_hash = canonical_args_hash(validated)
    return validated, args_hash, signer.sign(_claim(record, args_hash))


def verified_edit(signer: ApprovalSigner, record: ApprovalRecord, call_args_hash: str) -> dict[str, Any] | None:
    """The edited arguments to run the call with, or None when the edit's binding does not verify."""
    edited = record.edited_args
    if edited is None or call_args_hash != record.args_hash:
        return None
    if canonical_args_hash(edited) != record.edited_args_hash:
        return None
    if not signer.verify(_claim(record, record.edited_args_hash), record.edited_token):
        return None
    return edited


def with_args(assistant: AssistantMessage, edited: dict[str, dict[str, Any]]) -> AssistantMessage:
    """The assistant message with the reviewer's arguments on the edited calls, so the transcript shows the
    model what was run (as a human-in-the-loop edit does), not what it first asked for."""
    if not edited:
        return assistant
    parts = [
        p.model_copy(update={"args": edited[p.id]}) if isinstance(p, ToolCall) and p.id in edited else p
        for p in assistant.parts
    ]
    return assistant.model_copy(update={"parts": parts})
