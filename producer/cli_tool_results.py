"""Client-side tool calls at the command line: `stepq resume TURN --results JSON`, the answers `stepq run` asks
for at the terminal, and the JSON option values `stepq approve --args` and `resume` share."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from stepq.config.settings import Settings
from stepq.errors import ToolResultsError
from stepq.models import Event
from stepq.producer.client import Client
from stepq.producer.failures import UsageError, err
from stepq.producer.render import compact


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


def answer_at_terminal(client: Client, event: Event, out: TextIO) -> None:
    """`stepq run` meets a client-side tool call: a person at the terminal types each result (JSON, or plain
    text taken as a string); without a terminal every call gets an error result, so the turn never hangs on a
    caller that is not there (as an approval is denied)."""
    calls = [c for c in event.data.get("calls") or [] if isinstance(c, dict)]
    if not calls:
        return
    results: dict[str, Any] = {}
    errors: list[str] = []
    interactive = sys.stdin.isatty()
    for call in calls:
        call_id, tool = str(call.get("tool_call_id")), str(call.get("tool"))
        if not interactive:
            results[call_id] = f"no client to run {tool}: stepq run's stdin is not a terminal"
            errors.append(call_id)
            continue
        out.write(f"\nResult of client-side tool {tool} {compact(call.get('args', {}), 400)}?\n  ({call_id}) ")
        out.flush()
        line = sys.stdin.readline().strip()
        try:
            results[call_id] = json.loads(line)
        except json.JSONDecodeError:
            results[call_id] = line
    if not interactive:
        err(f"{len(calls)} client-side tool call(s) answered as errors: stdin is not a terminal")
    try:
        client.resume(event.turn_id, results, errors=errors)
    except ToolResultsError as exc:  # answered already (a replayed turn, another caller): the turn goes on
        err(f"results not taken: {exc}")
