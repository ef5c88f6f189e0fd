"""`stepq status`: queues and their depth, live workers, active turns, parked turns and their approvals.

Everything comes from Redis (state store and broker), never from a broadcast to workers: workers are
listed from their heartbeats (shared/heartbeat.py says why). Turn lists are capped at `limit` each.
"""

from __future__ import annotations

import time
from typing import Any

from stepq.fleet.heartbeat import live_workers
from stepq.fleet.metrics import QueueDepths, pending_approval_count
from stepq.fleet.protocol import fingerprint_queue, worker_queues
from stepq.fleet.runtime import Runtime
from stepq.models import TurnState, TurnStatus
from stepq.producer.deploys import agent_versions, open_turns
from stepq.producer.render import Style
from stepq.store.indexes import ACTIVE, AWAITING


def collect_status(rt: Runtime, limit: int = 20, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    settings, client = rt.settings, rt.redis
    workers = live_workers(client, settings.state_prefix, now)
    versions = agent_versions(workers, open_turns(rt))
    rows = [(r, fingerprint_queue(settings, a, r["fingerprint"])) for a, rs in versions.items() for r in rs]
    shared = worker_queues(settings)
    queues: list[dict[str, Any]] = []
    depths = QueueDepths(settings)
    try:
        found = depths.read([*shared, *(q for _, q in rows)])  # one read: the shared queues and each definition's
        queues = [{"name": q, "depth": found.get(q)} for q in shared]
    except Exception as exc:  # the broker is down or unreachable: say so, show the rest
        found = {}
        queues = [{"name": q, "depth": None, "error": str(exc)} for q in shared]
    finally:
        depths.close()
    for row, queue in rows:
        row.update(queue=queue, waiting=found.get(queue))

    indexes = rt.turns.indexes  # sharded: counted and merged over every shard
    active_count, active = indexes.count(ACTIVE), indexes.first(ACTIVE, limit, newest=True)
    awaiting_count, awaiting = indexes.count(AWAITING), indexes.first(AWAITING, limit, newest=False)
    states = _load(rt, [t for t, _ in active] + [t for t, _ in awaiting])

    running = []
    for turn_id, score in active:
        state = states.get(turn_id)
        if state is not None:
            running.append(
                {
                    "turn_id": turn_id,
                    "agent": state.agent,
                    "status": state.status.value,
                    "step": state.step,
                    "attempt": state.attempt,
                    "provider": state.provider,
                    "model": state.model,
                    "updated_s_ago": round(max(0.0, now - score), 1),
                }
            )

    parked = []
    batched = []  # the awaiting index also holds turns parked for a provider batch (scored by their deadline)
    for turn_id, deadline in awaiting:
        state = states.get(turn_id)
        if state is not None and state.status == TurnStatus.AWAITING_BATCH:
            batched.append({"turn_id": turn_id, "agent": state.agent, "step": state.step, "provider": state.provider,
                            "model": state.model, "deadline_in_s": round(deadline - now, 1)})  # fmt: skip
            continue
        if state is None or state.parked is None:
            continue
        records = rt.approvals.get_many([a.approval_id for a in state.parked.approvals])
        approvals = []
        for a in state.parked.approvals:
            record = records.get(a.approval_id)
            status = record.status if record is not None else "missing"
            if status == "pending" and a.expires_at <= now:
                status = "expired"
            approvals.append(
                {
                    "approval_id": a.approval_id,
                    "tool": a.tool_name,
                    "tool_call_id": a.tool_call_id,
                    "status": status,
                    "expires_at": a.expires_at,
                    "expires_in_s": round(a.expires_at - now, 1),
                }
            )
        tool_calls = [  # client-side calls waiting for `stepq resume` / Client.resume
            {"tool_call_id": c.tool_call_id, "tool": c.tool_name, "expires_in_s": round(c.expires_at - now, 1)}
            for c in state.parked.client_calls
        ]
        parked.append(
            {
                "turn_id": turn_id,
                "agent": state.agent,
                "status": state.status.value,
                "step": state.step,
                "approvals": approvals,
                "tool_calls": tool_calls,
            }
        )

    return {
        "key_prefix": settings.key_prefix,
        "queues": queues,
        "workers": workers,
        "agent_versions": versions,
        "active_turns": {"count": int(active_count), "turns": running},
        "awaiting_batch": {"count": len(batched), "turns": batched},
        "awaiting_approval": {
            "count": int(awaiting_count) - len(batched),
            "pending_approvals": pending_approval_count(client, settings.state_prefix, now),
            "turns": parked,
        },
    }


def _load(rt: Runtime, turn_ids: list[str]) -> dict[str, TurnState]:
    if not turn_ids:
        return {}
    pipe = rt.redis.pipeline(transaction=False)
    for turn_id in turn_ids:
        pipe.get(rt.keys.turn(turn_id))
    return {t: TurnState.model_validate_json(raw) for t, raw in zip(turn_ids, pipe.execute(), strict=True) if raw}


def status_lines(status: dict[str, Any], style: Style) -> list[str]:
    lines = [style.bold("queues")]
    for q in status["queues"]:
        depth = q["depth"]
        shown = "?" if depth is None else f"{depth} waiting"
        lines.append(f"  {q['name']:<32} {shown}" + (f"  {style.red(q['error'])}" if q.get("error") else ""))

    workers = status["workers"]
    lines.append(style.bold(f"workers ({len(workers)} live)"))
    for w in workers:
        metrics = f"  metrics :{w['metrics_port']}" if w.get("metrics_port") else ""
        lines.append(
            f"  {w['name']:<32} {w.get('pool', '?')} pool, {w.get('concurrency', '?')} slots, {w.get('active', '?')} busy"
            f"{metrics}  seen {w['seconds_ago']:.0f}s ago"
        )
    if not workers:
        lines.append(style.yellow("  none: start one with `stepq worker`"))

    lines += version_lines(status.get("agent_versions", {}), style)

    active = status["active_turns"]
    lines.append(style.bold(f"active turns ({active['count']} queued or running)"))
    for t in active["turns"]:
        lines.append(
            f"  {t['turn_id']}  {t['agent']}  {t['status']}  step {t['step']}"
            + (f"  attempt {t['attempt']}" if t["attempt"] else "")
            + f"  updated {t['updated_s_ago']:.0f}s ago"
        )

    batched = status["awaiting_batch"]
    if batched["count"]:
        lines.append(style.bold(f"awaiting a provider batch ({batched['count']} turns, no worker held)"))
        for t in batched["turns"]:
            lines.append(f"  {t['turn_id']}  {t['agent']}  step {t['step']}  {t['provider']}/{t['model']}"
                         f"  online in {max(t['deadline_in_s'], 0) / 60:.0f} min at the latest")  # fmt: skip
    parked = status["awaiting_approval"]
    lines.append(
        style.bold(
            f"parked, awaiting approval or tool results ({parked['count']} turns, {parked['pending_approvals']} pending approvals)"
        )
    )
    for t in parked["turns"]:
        lines.append(f"  {t['turn_id']}  {t['agent']}  {t.get('status', 'awaiting_approval')}  step {t['step']}")
        for c in t.get("tool_calls", []):
            lines.append(f"    {c['tool_call_id']}  {c['tool']}  awaiting its result (stepq resume {t['turn_id']})")
        for a in t["approvals"]:
            left = a["expires_in_s"]
            when = f"expires in {left / 60:.0f} min" if left >= 120 else f"expires in {max(left, 0):.0f} s"
            lines.append(f"    {a['approval_id']}  {a['tool']}  {a['status']}  {when}")
    return lines


def version_lines(versions: dict[str, list[dict[str, Any]]], style: Style) -> list[str]:
    """Per agent, each definition served or still run (a rolling upgrade shows two): who serves it, what is
    pinned to it. Agents served by one definition with nothing pinned are one line each."""
    if not versions:
        return []
    lines = [style.bold("agent versions (fingerprint, version, workers serving it, turns pinned to it)")]
    for agent_id, rows in versions.items():
        lines.append(f"  {agent_id}")
        for r in rows:
            served = len(r["workers"])
            where = _count(served, "worker") if served else style.yellow("no worker serves it")
            text = f"    {r['fingerprint'][:12]}  {r['version'] or '-':<12} {where}"
            text += f", {r['pinned']} pinned" if r["pinned"] else ""
            text += f", {_count(r['waiting'], 'step')} waiting in its queue" if r.get("waiting") else ""
            text += f", {_count(r['turns'], 'open turn')} last ran on it" if r["turns"] else ""
            lines.append(text)
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"
