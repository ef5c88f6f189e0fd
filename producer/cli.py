"""`stepq`: run a worker, submit and follow turns, decide approvals, inspect and cancel turns, run the demo.

Exit codes: 0 success (a turn completed), 1 the turn failed or was cancelled or a
decision was refused, or Redis/the broker is unreachable, 2 bad input (unknown agent or turn,
malformed option), 130 interrupted (Ctrl-C), 141 stdout's reader went away (`… | head`).
Failures print one line (stepq.producer.failures), never a traceback.
"""

from __future__ import annotations

import argparse
import getpass
import importlib.metadata
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TextIO

from stepq.config.settings import Settings
from stepq.embedded import local_worker
from stepq.errors import ApprovalError, MissingExtraError
from stepq.fleet.metrics import prepare_multiprocess_dir
from stepq.fleet.protocol import worker_queues
from stepq.logging import configure_logging
from stepq.models import Event, EventType, TurnResult, TurnStatus
from stepq.producer import batch as batch_cli
from stepq.producer import cli_agents, cli_drain, cli_listings, cli_policy, cli_tenant_keys, cli_tool_results
from stepq.producer.cli_start import load_settings as load_settings
from stepq.producer.cli_start import reach_redis as reach_redis
from stepq.producer.client import Client
from stepq.producer.demo import run_demo
from stepq.producer.demo_serve import serve_demo
from stepq.producer.failures import (
    EMBEDDED_STATE_HINT,
    INTERRUPTED_EXIT,
    UsageError,
    describe,
    err,
    interrupt_twice_to_quit,
    quiet_broken_pipe,
    seconds,
    show_tracebacks,
    unexpected,
)
from stepq.producer.render import LiveView, Style, compact, event_summary, result_lines, state_lines, trace_table
from stepq.producer.status import collect_status, status_lines
from stepq.turns.listings import MAX_LIMIT

NO_WORKER_AFTER_S = 15.0
BEAT_SCHEDULER = "celery.beat:Scheduler"  # in-memory; the default PersistentScheduler writes a shelve file


def importable_cwd() -> None:
    """Agent modules in the current directory import as they do under `celery -A` (and `python -m`).

    Appended, so a file or folder there never shadows an installed package the CLI imports later."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def version() -> str:
    try:
        return importlib.metadata.version("stepq")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


# --------------------------------------------------------------------------- following a turn


def follow(
    client: Client, turn_id: str, after: int = 0, on_idle: Callable[[TurnStatus], None] | None = None
) -> Iterator[Event]:
    """A turn's events until it finishes; `on_idle` hears about every quiet stretch of NO_WORKER_AFTER_S."""
    cursor = after
    while True:
        try:
            for event in client.events(turn_id, after=cursor, idle_timeout=NO_WORKER_AFTER_S if on_idle else None):
                cursor = event.seq
                yield event
            return
        except TimeoutError:
            if on_idle is not None:
                on_idle(client.get(turn_id).status)


def no_worker_hint(turn_id: str, out: TextIO) -> Callable[[TurnStatus], None]:
    warned = [False]

    def on_idle(status: TurnStatus) -> None:
        if status == TurnStatus.QUEUED and not warned[0]:
            warned[0] = True
            print(
                f"stepq: no worker has picked up turn {turn_id} after {NO_WORKER_AFTER_S:.0f} s. Is `stepq worker` "
                "running with the same STEPQ_REDIS_URL, STEPQ_KEY_PREFIX, STEPQ_QUEUE and STEPQ_AGENT_MODULES? "
                "Still waiting…",
                file=out,
                flush=True,
            )

    return on_idle


@dataclass
class Decider:
    """Answers approval requests during `stepq run`: --approve-all, --deny-all, or ask the person at the terminal."""

    mode: str  # "approve" | "deny" | "ask"
    out: TextIO
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def decide(self, client: Client, event: Event) -> None:
        d = event.data
        approval_id, tool, args = str(d["approval_id"]), str(d.get("tool")), d.get("args", {})
        record = client.runtime.approvals.get(approval_id)
        if record is not None and record.status != "pending":
            return  # decided before we got here (a replayed turn, another reviewer)
        reviewer = "cli"  # an automatic decision; a person's answer carries their name
        if self.mode == "approve":
            approved, reason = True, "approved with --approve-all"
        elif self.mode == "deny":
            approved, reason = False, "denied with --deny-all"
        elif not sys.stdin.isatty():
            approved, reason = False, "no reviewer: stdin is not interactive"
            err(
                f"approval {approval_id} ({tool}): stdin is not a terminal, so it is denied; pass --approve-all or --deny-all"
            )
        else:
            approved, reason = self._ask(approval_id, tool, args)
            reviewer = _person()
        receipt = client.approve(approval_id, approved, reason=reason, reviewer=reviewer)
        outcome: dict[str, Any] = {"approval_id": approval_id, "tool": tool, "args": args, "approved": approved}
        try:
            receipt.wait(timeout=30.0)
            outcome["accepted"] = True
        except (ApprovalError, TimeoutError) as exc:
            outcome["accepted"] = False
            outcome["refused"] = str(exc)
            err(f"decision on {approval_id} was not accepted: {exc}")
        self.decisions.append(outcome)

    def _ask(self, approval_id: str, tool: str, args: Any) -> tuple[bool, str]:
        self.out.write(f"\nApprove {tool} {compact(args, 400)}?\n  ({approval_id}) [y/N] ")
        self.out.flush()
        answer = sys.stdin.readline().strip().lower()
        approved = answer in ("y", "yes")
        self.out.write("  reason (optional): ")
        self.out.flush()
        reason = sys.stdin.readline().strip() or ("approved at the terminal" if approved else "denied at the terminal")
        return approved, reason


# --------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    metadata: dict[str, Any] | None = None
    if args.metadata is not None:
        try:
            metadata = json.loads(args.metadata)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--metadata is not valid JSON: {exc.msg} at position {exc.pos}") from None
        if not isinstance(metadata, dict):
            raise UsageError("--metadata must be a JSON object")
    args.context = _json_object(args.context, "--context")
    prompt = args.prompt
    if prompt is None:
        if sys.stdin.isatty():
            raise UsageError("give a PROMPT (or pipe it on stdin)")
        prompt = sys.stdin.read()
    client = Client(settings)  # loads the agent modules: one that fails to import stops here, before any worker
    worker: AbstractContextManager[None] = local_worker(settings) if settings.embedded else nullcontext()
    with client, worker:  # closing the client releases the embedded worker its submit shares
        return _run_turn(args, settings, client, prompt, metadata)


def _json_object(raw: str | None, option: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object")
    return value


def _loop(args: argparse.Namespace) -> dict[str, Any] | None:
    loop: dict[str, Any] = {}
    if args.max_steps is not None:
        loop["max_steps"] = args.max_steps
    if args.budget is not None:
        loop["budget"] = args.budget
    return loop or None


def _run_turn(
    args: argparse.Namespace, settings: Settings, client: Client, prompt: str, metadata: dict[str, Any] | None
) -> int:
    handle = client.submit(
        args.agent,
        prompt=prompt,
        idempotency_key=args.idempotency_key,
        metadata=metadata,
        features=args.feature or None,
        provider=args.provider,
        model=args.model,
        loop=_loop(args),
        context=args.context,
        defer_tools=args.defer_tools,
    )
    mode = "approve" if args.approve_all else "deny" if args.deny_all else "ask"
    live = not args.json
    out = sys.stdout if live else sys.stderr
    decider = Decider(mode, out)
    view = LiveView(sys.stdout) if live else None
    if view is not None and not handle.created:
        view.line(view.style.dim(f"idempotency key already used: following existing turn {handle.turn_id}"))
    try:
        for event in follow(
            client, handle.turn_id, on_idle=None if settings.embedded else no_worker_hint(handle.turn_id, sys.stderr)
        ):
            if view is not None:
                view.on_event(event)
            if event.type == EventType.APPROVAL_REQUEST:
                decider.decide(client, event)
            elif event.type == EventType.TOOL_RESULTS_REQUEST:
                cli_tool_results.answer_at_terminal(client, event, out)
        result = client.wait(handle.turn_id, timeout=60.0)
    except KeyboardInterrupt:
        if view is not None:
            view.close_inline()
        print(interrupted_run(handle.turn_id, settings), file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    if view is not None:
        view.line()
        for line in result_lines(result, view.style, answer=not view.answer_streamed):  # printed once, as it came
            view.line(line)
    else:
        payload = result.model_dump(mode="json")
        payload["approvals"] = decider.decisions
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    return exit_code(result)


def interrupted_run(turn_id: str, settings: Settings) -> str:
    """What Ctrl-C leaves behind: with Redis the turn goes on in the workers; embedded, it ends with us."""
    if settings.embedded:
        return (
            f"stepq: interrupted; turn {turn_id} stops with this process (embedded mode runs it in here). "
            "Stopping the in-process worker; Ctrl-C again to quit at once.\n"
            "  set STEPQ_REDIS_URL and run `stepq worker` for turns that outlive the command"
        )
    return (
        f"stepq: interrupted; turn {turn_id} goes on in the workers\n"
        f"  follow it: stepq events {turn_id}\n"
        f"  cancel it: stepq cancel {turn_id}"
    )


def _person() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def exit_code(result: TurnResult) -> int:
    return 0 if result.status == TurnStatus.COMPLETED else 1


def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    client = Client(settings)
    client.get(args.turn)
    if args.follow:
        events: Iterator[Event] = client.events(args.turn, after=args.after)
    else:
        events = _read_all(client, args.turn, args.after)
    for event in events:
        if args.json:
            print(event.model_dump_json(), flush=True)
        else:
            print(f"{event.seq:>5}  step {event.step:<3} {event.type.value:<17} {event_summary(event)}", flush=True)
    return 0


def _read_all(client: Client, turn_id: str, after: int) -> Iterator[Event]:
    cursor = after
    while True:
        page = client.runtime.events.read(turn_id, cursor)
        yield from page
        if len(page) < 1000:
            return
        cursor = page[-1].seq


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    client = Client(settings)
    state = client.get(args.turn)
    if args.trace:  # only the per-step trace: one row per model step
        if args.json:
            print(json.dumps(state.trace.model_dump(mode="json")["steps"], indent=2, ensure_ascii=False))
        else:
            for line in trace_table(state.trace):
                print(line)
        return 0
    pending = _pending_approvals(client, args.turn) if state.status.parked else []
    if args.json:
        payload = state.result().model_dump(mode="json")
        payload.update(
            provider=state.provider,
            model=state.model,
            step=state.step,
            created_at=state.created_at,
            finished_at=state.finished_at,
            metadata=state.metadata,
            origin=state.metadata.get("origin"),
            pending_approvals=pending,
            pending_tool_calls=client_calls(state),
        )
        print(json.dumps(payload, indent=2, ensure_ascii=False))
        return 0
    style = Style(sys.stdout)
    for key, value in state_lines(state):
        print(f"{style.dim(key.ljust(9))} {value}")
    if state.error:
        print(f"{style.dim('error'.ljust(9))} {style.red(state.error)}")
    if state.object is not None or state.text:
        print(f"\n{style.bold('result')}")
        body = json.dumps(state.object, indent=2, ensure_ascii=False) if state.object is not None else state.text
        for line in body.splitlines():
            print(f"  {line}")
    for p in pending:
        print(f"\n{style.yellow('pending approval')} {p['approval_id']}: {p['tool']} {compact(p['args'])}")
        print(f"  stepq approve {p['approval_id']} --yes   (or --no --reason '…')")
    calls = client_calls(state)
    for c in calls:
        print(f"\n{style.yellow('awaiting tool result')} {c['tool_call_id']}: {c['tool']} {compact(c['args'])}")
    if calls:
        example = json.dumps({c["tool_call_id"]: "…" for c in calls}, ensure_ascii=False)
        print(f"  stepq resume {state.turn_id} --results {shlex.quote(example)}")
    if state.trace.steps:
        print(f"\n{style.bold('steps')}")
        for line in trace_table(state.trace):
            print(f"  {line}")
    return 0


def client_calls(state: Any) -> list[dict[str, Any]]:
    """The client-side tool calls a parked turn waits for (`stepq resume` answers them)."""
    if not state.status.parked or state.parked is None:
        return []
    return [
        {"tool_call_id": c.tool_call_id, "tool": c.tool_name, "args": c.args, "expires_at": c.expires_at}
        for c in state.parked.client_calls
    ]


def _pending_approvals(client: Client, turn_id: str) -> list[dict[str, Any]]:
    """Pending approvals of a parked turn (from the approval-request events; tokens stay in Redis)."""
    state = client.get(turn_id)
    if state.parked is None:
        return []
    wanted = {a.approval_id for a in state.parked.approvals}
    records = client.runtime.approvals.get_many(sorted(wanted))
    found = []
    for event in _read_all(client, turn_id, 0):
        d = event.data
        aid = d.get("approval_id")
        record = records.get(aid) if isinstance(aid, str) else None
        if event.type == EventType.APPROVAL_REQUEST and record is not None and record.status == "pending":
            found.append({k: d.get(k) for k in ("approval_id", "tool", "args", "expires_at")})
    return found


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    limit = cli_listings.check_limit(args.limit)
    if settings.embedded:
        raise UsageError(f"`stepq status` needs a shared Redis: {EMBEDDED_STATE_HINT}")
    status = collect_status(Client(settings).runtime, limit=limit)
    if args.json:
        print(json.dumps(status, indent=2, ensure_ascii=False))
    else:
        for line in status_lines(status, Style(sys.stdout)):
            print(line)
    return 0


def cmd_approve(args: argparse.Namespace, settings: Settings) -> int:
    if settings.embedded:
        raise UsageError(
            "`stepq approve` needs a shared Redis (set STEPQ_REDIS_URL); in embedded mode `stepq run` decides "
            "approvals itself (--approve-all, --deny-all, or interactively)"
        )
    client = Client(settings)
    if args.batch is not None:
        return batch_cli.approve_batch_command(client, args)
    if args.approval_id is None or args.all or args.filter:
        raise UsageError("`stepq approve` takes an APPROVAL_ID, or --batch ID with --all or --filter")
    edited = cli_tool_results.json_object(args.args, "--args")
    receipt = client.approve(
        args.approval_id, args.yes, reason=args.reason, reviewer=args.reviewer, token=args.token, args=edited
    )
    try:
        receipt.wait(timeout=args.timeout)
    except ApprovalError as exc:
        print(f"refused ({exc.code}): {exc}")
        return 1
    except TimeoutError as exc:
        err(f"{exc}; is `stepq worker` running?")
        return 1
    print(f"accepted: approval {args.approval_id} {'approved' if args.yes else 'denied'}")
    return 0


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    client = Client(settings)
    state = client.get(args.turn)
    if state.status.terminal:
        print(f"turn {args.turn} already {state.status.value}")
        return 0
    client.cancel(args.turn)
    try:
        result = client.wait(args.turn, timeout=args.wait)
    except TimeoutError:
        print(
            f"cancel requested; turn {args.turn} is still {client.get(args.turn).status.value} (a worker will stop it)"
        )
        return 0
    print(f"turn {args.turn} {result.status.value}")
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    if settings.embedded:
        raise UsageError(
            "`stepq worker` needs STEPQ_REDIS_URL (and optionally STEPQ_BROKER_URL): without it stepq runs "
            "embedded, with no separate worker. Try `stepq demo`, or `stepq run` which starts one in-process."
        )
    if args.pool == "gevent" and importlib.util.find_spec("gevent") is None:
        raise MissingExtraError("`stepq worker --pool gevent`", "gevent")
    if args.pool == "gevent" and (settings.beat if args.beat is None else args.beat):
        raise UsageError(  # celery refuses -B with gevent, with a traceback
            "`--pool gevent` cannot embed beat: add --no-beat (or STEPQ_BEAT=false) and run the sweeper's schedule "
            "elsewhere, in a threads worker or `celery -A stepq.workers.celery_app beat`"
        )
    if args.concurrency < 1:  # celery would take 0 for "one per CPU" and fail on a negative with its own usage
        raise UsageError(f"--concurrency must be at least 1 (concurrent steps), not {args.concurrency}")
    if args.metrics_port is not None:
        check_port("--metrics-port", args.metrics_port, "0 (off)")
        os.environ["STEPQ_METRICS_PORT"] = str(args.metrics_port)  # read by the exec'd worker's Settings
    argv = worker_argv(args, settings)
    if not settings.agent_modules and not args.print_command:
        err("no STEPQ_AGENT_MODULES set: loading the bundled demo agents (stepq.agents.demo)")
        os.environ["STEPQ_AGENT_MODULES"] = "stepq.agents.demo"
    if args.print_command:
        print(shlex.join(argv))
        return 0
    Client(settings)  # loads the agent modules: one that fails to import is one line here, not a crash loop there
    prepare_multiprocess_dir(args.pool, os.environ)  # prefork: children's metrics reach the parent's /metrics
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # not reached


def worker_argv(args: argparse.Namespace, settings: Settings) -> list[str]:
    """`celery -A stepq.workers.celery_app worker …` as an argv list."""
    argv = [
        sys.executable, "-m", "celery", "-A", "stepq.workers.celery_app", "worker",
        f"--pool={args.pool}", f"--concurrency={args.concurrency}", f"--loglevel={args.loglevel}",
        "-Q", args.queues or ",".join(worker_queues(settings)),
    ]  # fmt: skip
    argv.append(f"--hostname={args.hostname or default_node_name()}")
    beat = settings.beat if args.beat is None else args.beat
    if beat:  # the schedule (one sweep entry) lives in memory: no schedule file to leave behind
        argv += ["-B", f"--scheduler={BEAT_SCHEDULER}"]
    return argv


def default_node_name() -> str:
    """Celery's default, `celery@<host>`, is the same for every worker on a host: heartbeats (`stepq status`)
    and remote control would merge them. The pid, kept by the exec into celery, tells them apart."""
    return f"stepq-{os.getpid()}@%h"


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from stepq.producer.gateway.serve import serve  # lazy: the gateway extra (FastAPI, uvicorn, pyjwt)

    if args.port is not None:
        check_port("--port", args.port, "0 (any free port)")
    return serve(settings, host=args.host, port=args.port, insecure_dev=args.insecure_dev)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    if args.serve:
        check_port("--port", args.port, "0 (any free port)")
        return serve_demo(settings, host=args.host, port=args.port)
    return run_demo(settings)


def check_port(flag: str, port: int, zero: str) -> None:
    """A port the socket layer would refuse with an OverflowError: a usage error naming the flag."""
    if not 0 <= port <= 65535:
        raise UsageError(f"{flag} must be {zero} or a port number up to 65535, not {port}")


# --------------------------------------------------------------------------- argument parsing


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepq",
        description="Durable LLM agent loops on Celery workers with Redis. Configuration: STEPQ_* variables.",
    )
    parser.add_argument("--version", action="version", version=f"stepq {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("worker", help="run a Celery worker (needs STEPQ_REDIS_URL)")
    p.add_argument(
        "--pool",
        default="threads",
        choices=["threads", "gevent", "prefork", "solo"],
        help="Celery pool (default: threads, whose one event loop reads every provider stream of the process)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="concurrent steps (default: 32)")
    p.add_argument("--queues", help="comma-separated queues (default: STEPQ_QUEUE and STEPQ_QUEUE.batch)")
    p.add_argument("--loglevel", default="INFO")
    p.add_argument("--hostname", help="Celery node name (default: stepq-<pid>@<host>, unique on the host)")
    p.add_argument(
        "--beat", action=argparse.BooleanOptionalAction, default=None, help="embed the sweeper's schedule (default: on)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="first port to try for /metrics (default: STEPQ_METRICS_PORT, 9464); a taken port moves this worker "
        "to the next free one, so several workers share a host; 0 turns /metrics off",
    )
    p.add_argument("--print-command", action="store_true", help="print the celery command instead of running it")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("run", help="submit a turn and stream it")
    p.add_argument("agent", help="agent id, e.g. demo.support")
    p.add_argument("prompt", nargs="?", help="the user's message (default: read stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the result instead of the live view")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--approve-all", action="store_true", help="approve every approval request")
    group.add_argument("--deny-all", action="store_true", help="deny every approval request")
    p.add_argument("--idempotency-key", help="the same key returns the same turn")
    p.add_argument("--feature", action="append", default=[], help="a feature the caller has (repeatable)")
    p.add_argument("--metadata", help="JSON object handed to tools (e.g. tenant)")
    p.add_argument("--provider", help="provider override (if the agent allows it)")
    p.add_argument("--model", help="model override, `provider/model` allowed (if the agent allows it)")
    p.add_argument("--max-steps", type=int, help="tighten the agent's step limit")
    p.add_argument("--budget", metavar="PRESET", help="tighten the agent's budget to a preset (small, standard, long)")
    p.add_argument("--context", metavar="JSON", help="the runtime context the agent's tools read (its context_schema)")
    p.add_argument("--defer-tools", action="store_true", help="answer every tool call here, as a client-side tool's")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("events", help="print a turn's events")
    p.add_argument("turn")
    p.add_argument("--after", type=int, default=0, metavar="SEQ", help="only events after this seq")
    p.add_argument(
        "--follow", action=argparse.BooleanOptionalAction, default=True, help="keep following until the turn ends"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("show", help="a turn's status, result and per-step trace")
    p.add_argument("turn")
    p.add_argument("--json", action="store_true")
    p.add_argument("--trace", action="store_true", help="only the per-step trace (one row per model step)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("status", help="queues, live workers, active turns and pending approvals")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=20, help=f"turns listed per section (1-{MAX_LIMIT}, default: 20)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("approve", help="decide an approval request (or a batch's: --batch ID --all|--filter)")
    p.add_argument("approval_id", nargs="?")
    p.add_argument("token", nargs="?", help="optional: by default the pending approval's own token is used")
    decision = p.add_mutually_exclusive_group(required=True)
    decision.add_argument("--yes", action="store_true", help="approve")
    decision.add_argument("--no", action="store_true", help="deny")
    p.add_argument("--reason", default="")
    p.add_argument("--args", metavar="JSON", help="approve with these arguments instead (tools declared editable=True)")
    p.add_argument("--reviewer", default=os.environ.get("USER", ""))
    p.add_argument("--timeout", type=seconds, default=30.0, help="seconds to wait for the worker's answer")
    p.add_argument("--batch", metavar="ID", help="decide the approvals of this batch's parked turns")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="with --batch: every pending approval of the batch")
    which.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="with --batch: only approvals matching tool=NAME or key=GLOB (the item key); repeat to narrow",
    )
    p.set_defaults(func=cmd_approve)
    cli_tool_results.add_parser(sub)
    cli_policy.add_parser(sub)
    cli_tenant_keys.add_parser(sub)

    cli_agents.add_parser(sub)
    cli_listings.add_parsers(sub)
    cli_drain.add_parser(sub)

    p = sub.add_parser("cancel", help="cancel a turn")
    p.add_argument("turn")
    p.add_argument("--wait", type=seconds, default=10.0, help="seconds to wait for the turn to stop")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("serve", help="the HTTP/SSE gateway for chat UIs and services (needs STEPQ_REDIS_URL)")
    p.add_argument("--host", help="bind address (default: STEPQ_GATEWAY_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: STEPQ_GATEWAY_PORT or 8000)")
    p.add_argument(
        "--insecure-dev", action="store_true", help="with no API keys or JWT configured, let every request in"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="the embedded tour: no services, no API keys")
    p.add_argument("--serve", action="store_true", help="serve the web chat page on the demo agents instead")
    p.add_argument("--host", default="127.0.0.1", help="with --serve: the address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="with --serve: the port (default 8000; 0 picks one)")
    p.set_defaults(func=cmd_demo)

    # listed for --help only: main() hands `stepq batch …` to stepq.producer.batch before parsing
    sub.add_parser("batch", help="run a JSONL file of items through an agent (see `stepq batch --help`)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command ends here: failures are one line on stderr and an exit code, never a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
    importable_cwd()
    restore_interrupt = interrupt_twice_to_quit()
    try:
        try:
            code = _main(sys.argv[1:] if argv is None else list(argv))
        finally:  # also after argparse's exits (--help): a reader gone away surfaces here, not at interpreter exit
            sys.stdout.flush()
        return code
    except BrokenPipeError:
        return quiet_broken_pipe()
    except KeyboardInterrupt:
        err("interrupted")
        return INTERRUPTED_EXIT
    finally:
        restore_interrupt()


def _main(raw: list[str]) -> int:
    settings: Settings | None = None
    try:
        if raw[:1] == ["batch"]:  # its own parser (and settings): `stepq batch --help`
            return batch_cli.main(raw[1:])
        args = build_parser().parse_args(raw)
        settings = load_settings()
        configure_logging(settings)  # secrets redacted, JSON lines with STEPQ_LOG_JSON
        if args.func in ONE_SHOT:
            reach_redis(settings)
        code: int = args.func(args, settings)
        return code
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except Exception as exc:
        failure = describe(exc, settings)
        if failure is None:
            if show_tracebacks():
                raise
            failure = unexpected(exc)
        err(f"error: {failure.message}")
        return failure.code


# commands that do one thing and exit (not `worker` and `serve`, which wait Redis outages out, nor `demo`)
ONE_SHOT = frozenset(
    {
        cmd_run,
        cmd_events,
        cmd_show,
        cmd_status,
        cmd_approve,
        cmd_cancel,
        *cli_policy.COMMANDS,
        *cli_tenant_keys.COMMANDS,
        *cli_listings.COMMANDS,
        *cli_drain.COMMANDS,
    }
)


if __name__ == "__main__":
    sys.exit(main())
