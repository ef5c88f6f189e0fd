"""Finding things at the command line: `stepq turns`, `stepq approvals`, `stepq threads` (the tenant's listings,
newest first, paged by --cursor) and `stepq export TURN` (a turn as a self-contained JSON case for offline
replay, see stepq.providers.replay)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from stepq.config.settings import Settings
from stepq.models import TurnStatus
from stepq.producer.client import Client
from stepq.producer.failures import UsageError
from stepq.producer.render import Style, compact
from stepq.turns import listings
from stepq.turns.export import export_case

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(raw: str | None, now: float | None = None) -> float | None:
    """`--since`: a unix time in seconds, or a duration ago (`90s`, `15m`, `2h`, `7d`)."""
    if raw is None:
        return None
    value = raw.strip()
    match = _DURATION.match(value)
    if match:
        return (now if now is not None else time.time()) - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"--since {raw!r}: give a unix time in seconds or a duration ago like 15m, 2h, 7d") from None


def check_limit(raw: int) -> int:
    """A --limit from 1 to the listings' maximum (a larger one would ask Redis for a range it refuses)."""
    if not 1 <= raw <= listings.MAX_LIMIT:
        raise UsageError(f"--limit must be from 1 to {listings.MAX_LIMIT} (got {raw})")
    return raw


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _print(page: listings.Listing, as_json: bool, header: list[str], rows: list[list[str]]) -> None:
    if as_json:
        print(json.dumps(page.model_dump(mode="json"), indent=2, ensure_ascii=False))
        return
    style = Style(sys.stdout)
    if not rows:
        print(style.dim("nothing listed"))
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print(style.dim("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if page.next_cursor:
        print(style.dim(f"more: --cursor {page.next_cursor}"))


def cmd_turns(args: argparse.Namespace, settings: Settings) -> int:
    if args.status is not None and args.status not in {s.value for s in TurnStatus}:
        known = ", ".join(s.value for s in TurnStatus)
        raise UsageError(f"--status {args.status!r} is not a turn status; known: {known}")
    page = Client(settings).list_turns(
        tenant=args.tenant,
        status=args.status,
        agent=args.agent,
        thread=args.thread,
        batch=args.batch,
        since=parse_since(args.since),
        cursor=args.cursor,
        limit=check_limit(args.limit),
    )
    rows = []
    for t in page.items:
        assert isinstance(t, listings.TurnItem)
        rows.append(
            [t.turn_id, t.agent, t.status, str(t.step), _when(t.created_at), t.finish_reason or "-", _origin(t.origin)]
        )
    _print(page, args.json, ["TURN", "AGENT", "STATUS", "STEP", "CREATED", "FINISH", "ORIGIN"], rows)
    return 0


def _origin(origin: dict[str, Any] | None) -> str:
    return f"{origin['turn_id']}@{origin['step']}" if origin else "-"


def cmd_approvals(args: argparse.Namespace, settings: Settings) -> int:
    client = Client(settings)
    kind = client.decided_approvals if args.decided else client.pending_approvals
    page = kind(tenant=args.tenant, turn=args.turn, cursor=args.cursor, limit=check_limit(args.limit))
    now = time.time()
    rows = []
    for a in page.items:
        assert isinstance(a, listings.ApprovalItem)
        if args.decided:
            rows.append(
                [
                    a.approval_id,
                    a.tool,
                    compact(a.args, 60),
                    a.decision or "-",
                    a.decided_by or "-",
                    _when(a.decided_at),
                ]
            )
        else:
            waited = f"{(now - a.created_at) / 60:.0f} min"
            left = f"{max(a.expires_at - now, 0) / 60:.0f} min"
            rows.append([a.approval_id, a.tool, compact(a.args, 60), a.turn_id, waited, left])
    header = (
        ["APPROVAL", "TOOL", "ARGS", "DECISION", "BY", "DECIDED"]
        if args.decided
        else ["APPROVAL", "TOOL", "ARGS", "TURN", "WAITING", "EXPIRES IN"]
    )
    _print(page, args.json, header, rows)
    return 0


def cmd_threads(args: argparse.Namespace, settings: Settings) -> int:
    page = Client(settings).list_threads(tenant=args.tenant, cursor=args.cursor, limit=check_limit(args.limit))
    rows = []
    for t in page.items:
        assert isinstance(t, listings.ThreadItem)
        rows.append([t.thread_id, t.agent, t.title[:40] or "-", str(t.turns), t.status, _when(t.last_activity)])
    _print(page, args.json, ["THREAD", "AGENT", "TITLE", "TURNS", "STATUS", "LAST ACTIVITY"], rows)
    return 0


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    client = Client(settings)
    case = export_case(client.get(args.turn))
    text = json.dumps(case, indent=2, ensure_ascii=False) + "\n"
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if not path.parent.is_dir():
        raise UsageError(f"-o {args.output}: the folder {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"-o {args.output} is a folder; give the file to write")
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")  # whole or not at all: a reader never sees half a case
    partial.replace(path)
    print(f"wrote {path} ({len(case['steps'])} steps, agent {case['agent']}); replay it with stepq.providers.replay")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", default="", help="whose (a turn's metadata.tenant; default: turns with none)")
    p.add_argument("--limit", type=int, default=listings.DEFAULT_LIMIT, help=f"items per page (1-{listings.MAX_LIMIT})")
    p.add_argument("--cursor", help="continue after the previous page (its `more: --cursor ...` line)")
    p.add_argument("--json", action="store_true", help="the page as JSON (items and next_cursor)")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("turns", help="list turns, newest first (by status, agent, thread, batch, age)")
    p.add_argument("--status", help="queued, running, awaiting_approval, awaiting_tool_results, completed, ...")
    p.add_argument("--agent")
    p.add_argument("--thread")
    p.add_argument("--batch")
    p.add_argument("--since", help="created since: a unix time, or a duration ago (15m, 2h, 7d)")
    _common(p)
    p.set_defaults(func=cmd_turns)

    p = sub.add_parser("approvals", help="the approval inbox: pending (default) or --decided")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--pending", action="store_true", help="waiting for a reviewer (the default)")
    which.add_argument("--decided", action="store_true", help="decided: by whom, when")
    p.add_argument("--turn", help="only this turn's")
    _common(p)
    p.set_defaults(func=cmd_approvals)

    p = sub.add_parser("threads", help="list threads, most recently active first")
    _common(p)
    p.set_defaults(func=cmd_threads)

    p = sub.add_parser("export", help="write a turn as a self-contained JSON case (replayable offline)")
    p.add_argument("turn")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.set_defaults(func=cmd_export)


COMMANDS = frozenset({cmd_turns, cmd_approvals, cmd_threads, cmd_export})
