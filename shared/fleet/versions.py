"""Which agent definitions a worker serves, as its heartbeat advertises them and the queues it consumes for them.

A rolling upgrade runs two definitions of an agent side by side; each worker says, per agent, the fingerprint
it loads (stepq.agents.fingerprint), and consumes that fingerprint's queue (`fingerprint_queue`) beside the
shared ones, so a turn pinned to a definition (stepq.engine.upgrade) is taken only by a worker that loads it.
`fleet_versions` folds the live workers' heartbeats into what `stepq status` and `stepq drain` show.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

from typing import Any

from stepq.agents.fingerprint import version_of
from stepq.agents.registry import AgentRegistry
from stepq.config.settings import Settings
from stepq.fleet.protocol import fingerprint_queue


def served_agents(agents: AgentRegistry) -> dict[str, dict[str, Any]]:
    """Agent id -> {"fingerprint", "version"} of every agent this process loads (what a heartbeat carries)."""
    found = {}
    for agent_id in agents.ids():
        agent = agents.get(agent_id)
        if agent is not None:
            version = version_of(agent)
            found[agent_id] = {"fingerprint": version.fingerprint, "version": version.version}
    return found


def served_queues(settings: Settings, agents: AgentRegistry) -> list[str]:
    """The per-fingerprint queues of the agents this process loads."""
    return [fingerprint_queue(settings, a, v["fingerprint"]) for a, v in served_agents(agents).items()]


def fleet_versions(workers: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Agent id -> fingerprint -> {"version", "workers": [names]}, from live workers' heartbeat infos."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for worker in workers:
        for agent_id, served in (worker.get("agents") or {}).items():
            fingerprint = str(served.get("fingerprint", ""))
            entry = found.setdefault(agent_id, {}).setdefault(
                fingerprint, {"version": served.get("version"), "workers": []}
            )
            entry["workers"].append(worker.get("name", "?"))
    return found
