"""What a rolling upgrade looks like from Redis: per agent, which definitions the live workers serve and how
many turns are pinned to each (`stepq status`), and what one old definition is still needed for (`stepq drain`).

Everything comes from Redis: the workers' heartbeats say which fingerprints they load (stepq.fleet.versions),
the turns' states say which definition their last step ran under and whether they are pinned
(stepq.engine.upgrade), the broker says how many steps wait in a fingerprint's queue. A turn that ran under
the old definition needs it only if the rule (stepq.agents.compatibility) pins it against the definition this
process loads (the new code, in a deploy script); without another definition to check against, it counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepq.agents.compatibility import compare, pending_calls
from stepq.agents.fingerprint import version_of
from stepq.engine.upgrade import label, pinned_queue
from stepq.fleet.heartbeat import live_workers
from stepq.fleet.metrics import QueueDepths
from stepq.fleet.protocol import fingerprint_queue
from stepq.fleet.runtime import Runtime
from stepq.fleet.versions import fleet_versions
from stepq.models import AgentVersion, TurnState
from stepq.store.indexes import ACTIVE, AWAITING

SCAN_LIMIT = 5000  # turns read per index: a deploy-time look, not a hot path


@dataclass
class OpenTurns:
    """The queued, running and parked turns (of one agent, or all), as far as the scan reached."""

    states: list[TurnState]
    total: int  # how many the indexes hold (more than scanned when capped)
    scanned: int


def open_turns(rt: Runtime, agent_id: str | None = None, limit: int = SCAN_LIMIT) -> OpenTurns:
    indexes = rt.turns.indexes
    total = indexes.count(ACTIVE) + indexes.count(AWAITING)
    rows = [t for index in (ACTIVE, AWAITING) for t, _ in indexes.first(index, limit, newest=False)]
    ids = list(dict.fromkeys(rows))  # a turn may be listed in both
    states: list[TurnState] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        pipe = rt.redis.pipeline(transaction=False)
        for turn_id in chunk:
            pipe.get(rt.keys.turn(turn_id))
        for raw in pipe.execute():
            if raw:
                state = TurnState.model_validate_json(raw)
                if not state.status.terminal and (agent_id is None or state.agent == agent_id):
                    states.append(state)
    return OpenTurns(states, int(total), len(rows))


def agent_versions(workers: list[dict[str, Any]], turns: OpenTurns) -> dict[str, list[dict[str, Any]]]:
    """Agent id -> one row per fingerprint that workers serve or open turns ran under: version, workers
    serving it, turns pinned to it, open turns whose last step ran under it."""
    served = fleet_versions(workers)
    rows: dict[str, dict[str, dict[str, Any]]] = {}

    def row(agent_id: str, fingerprint: str, version: str | None) -> dict[str, Any]:
        found = rows.setdefault(agent_id, {}).setdefault(
            fingerprint, {"fingerprint": fingerprint, "version": version, "workers": [], "pinned": 0, "turns": 0}
        )
        found["version"] = found["version"] or version
        return found

    for agent_id, by_fingerprint in served.items():
        for fingerprint, entry in by_fingerprint.items():
            row(agent_id, fingerprint, entry["version"])["workers"] = sorted(entry["workers"])
    for state in turns.states:
        if state.agent_version is not None:
            row(state.agent, state.agent_version.fingerprint, state.agent_version.version)["turns"] += 1
        if state.pin is not None and pinned_queue(state):
            row(state.agent, state.pin.fingerprint, None)["pinned"] += 1
    return {
        a: sorted(r.values(), key=lambda x: (-len(x["workers"]), x["fingerprint"])) for a, r in sorted(rows.items())
    }


@dataclass
class DrainReport:
    agent: str
    fingerprint: str
    queue: str
    queue_depth: int | None
    workers: list[str]
    needs: list[dict[str, Any]] = field(default_factory=list)  # turns that still need the old definition
    moving: list[dict[str, Any]] = field(default_factory=list)  # turns on it that move to the new one
    checked_against: str | None = None  # the definition loaded here that turns were checked against
    scanned: int = 0
    total: int = 0

    @property
    def drained(self) -> bool:
        return not self.needs and self.queue_depth == 0 and self.scanned >= self.total

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "fingerprint": self.fingerprint,
            "queue": self.queue,
            "queue_depth": self.queue_depth,
            "workers": self.workers,
            "needs": self.needs,
            "moving": self.moving,
            "checked_against": self.checked_against,
            "drained": self.drained,
        }


def drain(rt: Runtime, agent_id: str, fingerprint: str) -> DrainReport:
    """What still needs this definition of the agent: pinned turns, turns on it that the rule would pin
    (parked approvals among them), and the steps waiting in its queue."""
    workers = live_workers(rt.redis, rt.settings.state_prefix)
    served = fleet_versions(workers).get(agent_id, {})
    turns = open_turns(rt, agent_id)
    full = _full_fingerprint(fingerprint, served, turns)
    queue = fingerprint_queue(rt.settings, agent_id, full)
    agent = rt.agents.get(agent_id)
    here: AgentVersion | None = version_of(agent) if agent is not None else None
    other = here if here is not None and here.fingerprint != full else None
    report = DrainReport(
        agent=agent_id,
        fingerprint=full,
        queue=queue,
        queue_depth=_depth(rt, queue),
        workers=sorted(served.get(full, {}).get("workers", [])),
        checked_against=label(other) if other is not None else None,
        scanned=turns.scanned,
        total=turns.total,
    )
    tools = {t.name: t for t in agent.visible_tools()} if agent is not None and other is not None else {}
    for state in turns.states:
        row = {"turn_id": state.turn_id, "status": state.status.value, "step": state.step}
        if state.pin is not None and state.pin.fingerprint == full and pinned_queue(state):
            report.needs.append({**row, "why": f"pinned: {state.pin.reason}"})
            continue
        version = state.agent_version
        if version is None or version.fingerprint != full:
            continue
        if other is None or agent is None:
            report.needs.append({**row, "why": "ran under it (no other definition loaded here to check against)"})
            continue
        verdict = compare(version, other, tools, pending_calls(state))
        if verdict.compatible or agent.on_incompatible_upgrade != "pin":
            report.moving.append(row)
        else:
            report.needs.append({**row, "why": "; ".join(verdict.blocking)})
    return report


def _full_fingerprint(prefix: str, served: dict[str, Any], turns: OpenTurns) -> str:
    """The full fingerprint a prefix names (as `stepq status` shows it, 12 digits), among those known."""
    known = set(served)
    for state in turns.states:
        known.update(v.fingerprint for v in (state.agent_version,) if v is not None)
        if state.pin is not None:
            known.add(state.pin.fingerprint)
    matches = sorted(f for f in known if f.startswith(prefix))
    return matches[0] if len(matches) == 1 else prefix


def _depth(rt: Runtime, queue: str) -> int | None:
    depths = QueueDepths(rt.settings)
    try:
        return depths.read([queue]).get(queue, 0)
    except Exception:  # the broker is unreachable: unknown, so not drained
        return None
    finally:
        depths.close()
