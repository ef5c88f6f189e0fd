"""The compatibility rule: may a turn that ran its last step under one definition run its next under another?

One explicit rule, by part (see `AgentVersion`):
  compatible:    prompt text or prompt version, new tools, a tool's schema that still accepts what the turn
                 waits on (a loosened schema), removed tools the turn waits on nothing from, the model, the
                 mutation policy (it gates the calls still to come; decided approvals stand);
  incompatible:  a tool the turn has a pending call or approval for was removed, or its new schema rejects
                 the stored arguments (they are validated against it, exactly as the resumed call would be), or
                 validates them into other arguments than a pending approval was given for (a new default);
                 the output schema changed under an object-mode turn; the execution mode changed.
What an incompatible change does is the agent's `on_incompatible_upgrade` (stepq.engine.upgrade).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stepq.agents.fingerprint import canonical
from stepq.agents.tools import ToolDefinition
from stepq.errors import ToolArgumentError
from stepq.models import AgentVersion, TurnState


@dataclass(frozen=True)
class PendingCall:
    """A call the turn waits on (a person's approval or a client's result), with the arguments stored for it."""

    tool_call_id: str
    tool: str
    args: dict[str, Any]  # as the model sent them (the resumed call validates these again)
    waits_for: str  # "approval" or "result"
    approved_args: dict[str, Any] | None = None  # an approval's: the validated arguments the person was shown


@dataclass(frozen=True)
class Verdict:
    """What changed between two definitions, and which of those changes this turn cannot run under."""

    changes: list[str] = field(default_factory=list)  # every difference, in words (for logs and traces)
    blocking: list[str] = field(default_factory=list)  # the incompatible ones for this turn
    whole_turn: bool = False  # a blocking change every later step depends on too (not only the pending calls)

    @property
    def compatible(self) -> bool:
        return not self.blocking


def pending_calls(state: TurnState) -> list[PendingCall]:
    """The calls a parked turn waits on, each with its stored arguments (an approval's validated ones)."""
    parked = state.parked
    if parked is None:
        return []
    asked = {c.id: c.args for c in parked.assistant.tool_calls}
    found = [
        PendingCall(a.tool_call_id, a.tool_name, asked.get(a.tool_call_id, a.args or {}), "approval", a.args)
        for a in parked.approvals
    ]
    found += [PendingCall(c.tool_call_id, c.tool_name, c.args, "result") for c in parked.client_calls]
    return found


def compare(
    old: AgentVersion,
    new: AgentVersion,
    new_tools: Mapping[str, ToolDefinition],
    pending: list[PendingCall],
) -> Verdict:
    """The verdict for a turn whose last step ran under `old` and whose next would run under `new`
    (`new_tools`: the tools the new definition shows, by name; `pending`: what the turn waits on)."""
    changes: list[str] = []
    blocking: list[str] = []
    whole_turn = False
    if old.prompt_version != new.prompt_version:
        changes.append(f"prompt version {old.prompt_version or '(none)'} -> {new.prompt_version or '(none)'}")
    added = sorted(new.tools.keys() - old.tools.keys())
    removed = sorted(old.tools.keys() - new.tools.keys())
    changed = sorted(n for n in old.tools.keys() & new.tools.keys() if old.tools[n] != new.tools[n])
    changes += [f"tool {n} added" for n in added]
    changes += [f"tool {n} removed" for n in removed]
    changes += [f"tool {n}'s argument schema changed" for n in changed]
    for call in pending:
        wait = f"a pending {call.waits_for} (call {call.tool_call_id})"
        if call.tool not in new.tools:
            blocking.append(f"tool {call.tool} was removed, and the turn has {wait} for it")
            continue
        if call.tool not in changed:
            continue
        definition = new_tools.get(call.tool)
        problem = _rejected(definition, call) if definition is not None else "the tool is not loaded"
        if problem is not None:
            blocking.append(f"tool {call.tool}'s new argument schema {problem} of {wait}")
    if old.execution_mode != new.execution_mode:
        change = f"execution mode {old.execution_mode} -> {new.execution_mode}"
        changes.append(change)
        blocking.append(change)
        whole_turn = True
    elif old.output != new.output:
        changes.append("the output schema changed")
        if new.execution_mode == "object":
            blocking.append("the output schema changed under this object-mode turn")
            whole_turn = True
    if old.mutation_policy != new.mutation_policy:
        changes.append(f"mutation policy {old.mutation_policy} -> {new.mutation_policy}")
    return Verdict(changes=changes, blocking=blocking, whole_turn=whole_turn)


def _rejected(definition: ToolDefinition, call: PendingCall) -> str | None:
    """Why the new definition cannot take the call as stored (None: it can). An approval binds the validated
    arguments the person was shown: new validation that adds a default or coerces a value differently would
    make the resumed call refuse to run, so it counts as much as a rejection."""
    try:
        validated = definition.validate(call.args)
    except ToolArgumentError as exc:
        return f"rejects the stored arguments ({exc})"
    approved = call.approved_args
    if approved is not None and canonical(validated) != canonical(approved):  # what the approval's hash binds
        return f"turns the approved arguments {canonical(approved)} into {canonical(validated)}"
    return None
