"""The compatibility check at every step: which definition of its agent a step runs under.

A turn keeps the `AgentVersion` its last step ran with. When a step starts on a worker whose definition has
another fingerprint (a deploy happened between two steps), the rule in stepq.agents.compatibility decides:
a compatible change moves the turn to the new definition here, at the step boundary; an incompatible one
follows the agent's `on_incompatible_upgrade`:
  pin       the step goes to the queue of the turn's fingerprint (`fingerprint_queue`), which only workers that
            still load that definition consume; the pin is stored with the turn (one commit, and for a parked
            turn its sweeper entry, on this rerouting delivery only) so status and drain see it and later
            steps go there directly;
  fail      the turn fails with one line naming what changed;
  continue  the step runs on the new definition anyway (logged).
Nothing here costs a round trip on an ordinary step: the version rides the step's own commit.
"""

from __future__ import annotations

import logging
import time

from stepq.agents.compatibility import compare, pending_calls
from stepq.agents.definition import AgentDefinition
from stepq.agents.fingerprint import version_of
from stepq.engine.context import Decision, Delivery, StepContext, none
from stepq.engine.finish import fail
from stepq.fleet.protocol import fingerprint_queue
from stepq.models import AgentVersion, Pin, StepLoss, TurnState
from stepq.store.indexes import ACTIVE

log = logging.getLogger("stepq.engine")


def pinned_queue(state: TurnState) -> str:
    """The queue this turn's current step must go to ('' when it is not pinned, or no longer)."""
    pin = state.pin
    if pin is None or (pin.through_step is not None and state.step > pin.through_step):
        return ""
    return pin.queue


def check(ctx: StepContext, agent: AgentDefinition) -> Decision | None:
    """Before a step runs on `agent` (as loaded, before policies): None to run it here, on this definition,
    or the Decision that pins or fails the turn instead."""
    state = ctx.state
    current = version_of(agent)
    previous = state.agent_version
    if previous is None:  # the turn's first step (or a turn stored before versions were kept)
        state.agent_version, state.started_fingerprint = current, state.started_fingerprint or current.fingerprint
        return None
    if previous.fingerprint == current.fingerprint:
        return None
    queue = pinned_queue(state)
    if queue and state.pin is not None and state.pin.fingerprint != current.fingerprint:
        return Decision("next", step=state.step, reason="pinned", queue=queue)  # already decided: send it on
    tools = {t.name: t for t in agent.visible_tools()}
    verdict = compare(previous, current, tools, pending_calls(state))
    if verdict.compatible:
        _moved(state, previous, current, ", ".join(verdict.changes) or "no change a turn depends on")
        return None
    what = "; ".join(verdict.blocking)
    policy = agent.on_incompatible_upgrade
    if policy == "continue":
        log.warning("turn %s continues on an incompatible definition of %s: %s", state.turn_id, agent.id, what)
        _moved(state, previous, current, what)
        return None
    if policy == "fail":
        return fail(ctx, incompatible_message(agent.id, previous, current, what))
    return pin(ctx, previous, what, through_step=None if verdict.whole_turn else state.step)


def incompatible_message(agent_id: str, old: AgentVersion, new: AgentVersion, what: str) -> str:
    return (
        f"agent {agent_id} changed incompatibly for this turn between its steps ({label(old)} -> {label(new)}): {what}"
    )


def label(version: AgentVersion) -> str:
    """A definition as people read it: its version string beside its short fingerprint."""
    return f"{version.version} ({version.short})" if version.version else version.short


def pin(ctx: StepContext | Delivery, previous: AgentVersion, reason: str, through_step: int | None) -> Decision:
    """Hold the turn on `previous`: store the pin (one fenced commit) and send the step to its queue."""
    state = ctx.state
    queue = fingerprint_queue(ctx.rt.settings, state.agent, previous.fingerprint)
    state.pin = Pin(fingerprint=previous.fingerprint, queue=queue, reason=reason, through_step=through_step)
    log.info("turn %s pinned to %s of %s (%s): step %s goes to %s", state.turn_id, label(previous), state.agent,
             reason, state.step, queue)  # fmt: skip
    if not ctx.commit():
        return none(StepLoss.COMMIT_LOST)
    if state.status.parked:  # a parked turn's commit lists it as waiting only: its decided resume is owed, as
        ctx.rt.turns.indexes.add(ACTIVE, state.turn_id, time.time())  # the decision listed it (the sweeper's)
    return Decision("next", step=state.step, reason="pinned", queue=queue)


def agent_missing(delivery: Delivery) -> Decision:
    """The turn's agent is not loaded here: a deploy dropped it, or this worker serves other agents. A turn
    that ran under a definition it may be pinned to goes to that definition's workers; otherwise it fails."""
    state = delivery.state
    previous = state.agent_version
    queue = pinned_queue(state)
    if queue:
        return Decision("next", step=state.step, reason="pinned", queue=queue)
    if previous is not None and previous.on_incompatible == "pin":
        return pin(delivery, previous, f"agent {state.agent} is not loaded on this worker", through_step=None)
    return fail(delivery, f"agent {state.agent!r} is not loaded on this worker")


def _moved(state: TurnState, previous: AgentVersion, current: AgentVersion, changes: str) -> None:
    log.info("turn %s moves from %s to %s of %s at step %s: %s", state.turn_id, label(previous), label(current),
             state.agent, state.step, changes)  # fmt: skip
    state.agent_version = current
    state.pin = None
