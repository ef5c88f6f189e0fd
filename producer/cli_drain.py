"""`stepq drain --agent ID --fingerprint F`: what still needs an old definition of an agent, for a deploy script.

It lists the turns pinned to the definition, the turns that ran under it and would be pinned at their next
step (parked approvals whose stored arguments the new schema rejects, object-mode turns whose schema changed),
and the steps waiting in its queue; it exits 0 when nothing is left (the old workers can be stopped, warm),
1 while something is. It checks against the definition this process loads (STEPQ_AGENT_MODULES: the new code).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from stepq.config.settings import Settings
from stepq.fleet.runtime import get_runtime
from stepq.producer.deploys import DrainReport, drain
from stepq.producer.failures import EMBEDDED_STATE_HINT, UsageError
from stepq.producer.render import Style

_FINGERPRINT = re.compile(r"^[0-9a-f]{6,64}$")


def cmd_drain(args: argparse.Namespace, settings: Settings) -> int:
    if settings.embedded:
        raise UsageError(f"`stepq drain` needs a shared Redis: {EMBEDDED_STATE_HINT}")
    if not _FINGERPRINT.match(args.fingerprint):
        raise UsageError(
            f"--fingerprint {args.fingerprint!r} is not a fingerprint: 6 to 64 hex digits, as `stepq status` shows"
        )
    report = drain(get_runtime(settings), args.agent, args.fingerprint)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, ensure_ascii=False))
    else:
        for line in drain_lines(report, Style(sys.stdout)):
            print(line)
    return 0 if report.drained else 1


def drain_lines(report: DrainReport, style: Style) -> list[str]:
    depth = "?" if report.queue_depth is None else str(report.queue_depth)
    workers = ", ".join(report.workers) or "none"
    lines = [
        style.bold(f"{report.agent} at {report.fingerprint[:12]}"),
        f"  served by      {workers}",
        f"  queue          {report.queue}: {depth} waiting",
        f"  checked        against {report.checked_against or 'nothing (this process loads no other definition)'}",
    ]
    if report.scanned < report.total:
        lines.append(style.yellow(f"  scanned        {report.scanned} of {report.total} open turns: run again"))
    for row in report.needs:
        lines.append(f"  needs it       {_turn(row)}: {row['why']}")
    for row in report.moving:
        lines.append(f"  moves on       {_turn(row)}: runs its next step on the new definition")
    if report.drained:
        lines.append(style.green("drained: nothing needs this definition; its workers can be stopped"))
    else:
        left = len(report.needs)
        lines.append(style.yellow(f"not drained: {left} turn{'s' if left != 1 else ''} and {depth} queued steps"))
    return lines


def _turn(row: dict[str, Any]) -> str:
    return f"{row['turn_id']} ({row['status']}, step {row['step']})"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("drain", help="what still needs an old definition of an agent (exit 0: nothing)")
    p.add_argument("--agent", required=True, help="the agent id")
    p.add_argument("--fingerprint", required=True, help="the old definition's fingerprint (12 digits suffice)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_drain)


COMMANDS = (cmd_drain,)  # one-shot: it reaches Redis first
