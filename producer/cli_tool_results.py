"""`stepq resume TURN --results JSON`: answer a turn's client-side tool calls from the command line, and the
JSON option values `stepq approve --args` and `resume` share."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepq.config import Settings
from stepq.producer.client import Client
from stepq.producer.failures import UsageError


def json_object(raw: str | None, option: str) -> dict[str, Any] | None:
    """An option's JSON object, or a one-line UsageError naming the option."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{option} is not valid JSON ({exc.msg} at character {exc.pos}); quote it for the shell"
        ) from None
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, not {type(value).__name__}")
    return value


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    if settings.embedded:
        raise UsageError(
            "`stepq resume` needs a shared Redis (set STEPQ_REDIS_URL): embedded turns live in one process"
        )
    results = json_object(args.results, "--results") or {}
    client = Client(settings)
    client.resume(args.turn, results, errors=args.error)
    print(f"accepted: {len(results)} result(s) for turn {args.turn}; follow it with `stepq events {args.turn}`")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("resume", help="answer a turn's client-side tool calls (status awaiting_tool_results)")
    p.add_argument("turn")
    p.add_argument(
        "--results", required=True, metavar="JSON", help="one result per open call: '{\"CALL_ID\": output, ...}'"
    )
    p.add_argument("--error", action="append", default=[], metavar="CALL_ID", help="this call's output is an error")
    p.set_defaults(func=cmd_resume)
