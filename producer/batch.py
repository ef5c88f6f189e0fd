"""`stepq batch`: push a JSONL file of items through one agent, write JSONL results, resumably.

Each item becomes a turn keyed by (batch id, item key, content hash), so a re-run
after an interruption re-uses turns that exist instead of submitting (and paying for)
them again (reported as reused), while an edited item is a new turn; with --resume,
items already in the output file with the same content are skipped. A bad item is
written as failed with its reason and never stops the batch. Duplicate keys are
refused with their line numbers unless --on-duplicate first|last says which one counts.

`stepq batch submit` hands the file to the workers instead (stepq.batches.driver) and
returns at once; `stepq batch status|wait|results ID` follow it from anywhere.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from stepq.batches import driver as batch_driver
from stepq.batches.items import (
    BatchItem,
    check_batch_id,
    derive_batch_id,
    item_idempotency_key,
    parse_item,
    result_line,
)
from stepq.embedded import local_worker
from stepq.engine.pricing import add_costs
from stepq.errors import ApprovalError, SubmitError, WaitTimeoutError
from stepq.fleet.protocol import BATCH_DRIVE, queue_for
from stepq.models import TurnState, TurnStatus
from stepq.producer.cli_start import load_settings, reach_redis
from stepq.producer.client import Client
from stepq.producer.failures import UsageError, seconds
from stepq.producer.render import money
from stepq.store.connection import get_many

if TYPE_CHECKING:
    import argparse


@dataclass
class Progress:
    total: int
    skipped: int = 0
    skipped_failed: int = 0
    reused: int = 0
    awaiting: int = 0
    done: int = 0
    failed: int = 0
    retrying: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None  # the turns' own stored costs summed (None when no price applies)
    started: float = field(default_factory=time.monotonic)

    @property
    def finished(self) -> int:
        return self.done + self.failed

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.finished / elapsed
        remaining = self.total - self.skipped - self.finished
        eta = f"{remaining / rate:,.0f}s" if rate > 0 else "?"
        width = 24
        ratio = (self.skipped + self.finished) / self.total if self.total else 1.0
        bar = "#" * int(ratio * width) + "-" * (width - int(ratio * width))
        return (
            f"[{bar}] {self.skipped + self.finished}/{self.total} done={self.done} failed={self.failed} "
            f"retrying={self.retrying} awaiting approval={self.awaiting} reused={self.reused} "
            f"{rate:.1f} items/s ETA {eta}"
        )


ItemLine = tuple[str, BatchItem | None, str | None]  # (key, item or None, error or None)


def read_items(path: Path) -> Iterator[ItemLine]:
    """One entry per non-blank line; a bad line keeps its own key when it has one, else `line-N`."""
    for _, entry in numbered_items(path):
        yield entry


def numbered_items(path: Path) -> Iterator[tuple[int, ItemLine]]:
    """Each non-blank line's item, or its key and why it is not one (that line fails; the others run)."""
    with path.open("rb") as handle:  # decoded per line: a line that is not UTF-8 fails alone, named
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a leading BOM (some editors write one)
            except UnicodeDecodeError as exc:
                yield (
                    number,
                    (f"line-{number}", None, f"line {number}: not UTF-8 text ({exc.reason} at byte {exc.start})"),
                )
                continue
            if not line.strip():
                continue
            try:
                item = parse_item(line, number)
                yield number, (item.key, item, None)
            except ValueError as exc:
                yield number, (_raw_key(line) or f"line-{number}", None, str(exc))


ON_DUPLICATE = ("refuse", "first", "last")


def input_problem(path: Path) -> str | None:
    """Why `path` cannot be read as the items' JSONL file (checked before anything is stored), or None."""
    if not path.exists():
        return f"no input file {path}"
    if path.is_dir():
        return f"--input {path} is a folder, not a JSONL file"
    return None


def read_input(path: Path, on_duplicate: str = "refuse") -> list[ItemLine]:
    """The file's items with each key once. Duplicate keys raise ValueError naming the lines (`refuse`),
    or keep the first or the last line of each key."""
    numbered = list(numbered_items(path))
    lines: dict[str, list[int]] = {}
    for number, (key, _, _) in numbered:
        lines.setdefault(key, []).append(number)
    duplicates = {key: numbers for key, numbers in lines.items() if len(numbers) > 1}
    if duplicates and on_duplicate == "refuse":
        shown = "; ".join(
            f"{key!r} on lines {', '.join(map(str, numbers))}" for key, numbers in list(duplicates.items())[:10]
        )
        more = f" (and {len(duplicates) - 10} more keys)" if len(duplicates) > 10 else ""
        raise ValueError(
            f"{path}: duplicate item keys: {shown}{more}; make each key unique, "
            "or pass --on-duplicate first|last to keep one line per key"
        )
    keep = {key: numbers[0] if on_duplicate == "first" else numbers[-1] for key, numbers in lines.items()}
    return [entry for number, entry in numbered if keep[entry[0]] == number]


def _raw_key(line: str) -> str | None:
    try:
        key = json.loads(line).get("key")
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) and key else None


def finished_keys(path: Path, current: dict[str, str] | None = None) -> dict[str, str]:
    """Key -> status for items already in an output file. A torn last line (a crash mid-write) is cut off.

    current: key -> content hash of the input now; a line whose item changed since is dropped from the
    file (the item runs again), so the file keeps one line per key."""
    if not path.exists():
        return {}
    keys: dict[str, str] = {}
    kept: list[bytes] = []
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                row = json.loads(raw)
                key = row["key"]
            except (ValueError, KeyError, TypeError):
                break
            if current is not None and key in current and row.get("item_hash", "") != current[key]:
                continue  # edited since that run: not done
            keys[key] = row.get("status", "")
            kept.append(raw)
    with path.open("wb") as handle:
        handle.write(b"".join(kept))
    return keys


class BatchRunner:
    def __init__(
        self,
        client: Client,
        agent: str,
        batch_id: str,
        out: IO[str],
        concurrency: int,
        progress_stream: IO[str] | None = None,
    ) -> None:
        self.client = client
        self.rt = client.runtime
        self.agent = agent
        self.batch_id = check_batch_id(batch_id)
        self.out = out
        self.concurrency = max(1, concurrency)
        self.progress_stream = progress_stream
        self.in_flight: dict[str, tuple[str, str, bool]] = {}  # turn id -> (item key, item hash, reused)
        self._last_render = 0.0

    def run(self, items: list[ItemLine], skip: dict[str, str]) -> Progress:
        progress = Progress(total=len(items))
        record = self.rt.keys.batch(self.batch_id)
        self.rt.redis.hset(record, mapping={"agent": self.agent, "total": len(items)})
        self.rt.redis.expire(record, self.client.settings.event_ttl_s)
        queue = []
        for key, item, error in items:
            if key in skip:
                progress.skipped += 1
                progress.skipped_failed += skip[key] != "completed"
            elif item is None:
                self._write({"key": key, "status": "failed", "error": error}, progress, failed=True)
            else:
                queue.append(item)
        cursor = "0-0"
        queue.reverse()
        while queue or self.in_flight:
            while queue and len(self.in_flight) < self.concurrency:
                self._submit(queue.pop(), progress)
            cursor = self._collect(cursor, progress)
            self._render(progress)
        self._render(progress, force=True)
        return progress

    def _submit(self, item: BatchItem, progress: Progress) -> None:
        try:
            handle = self.client.submit(
                self.agent,
                prompt=item.prompt_text(),
                messages=item.messages,
                idempotency_key=item_idempotency_key(self.batch_id, item),
                metadata={**item.metadata, "batch_id": self.batch_id, "item_key": item.key},
                priority="batch",
            )
        except SubmitError as exc:
            self._write({"key": item.key, "status": "failed", "error": str(exc)}, progress, failed=True)
            return
        item_hash = item.content_hash()
        state = self.client.get(handle.turn_id)
        if state.status.terminal:  # finished already: written now (an earlier run's answer is not paid again)
            # a turn this run created can finish before this read (a fast worker, a slow producer): not reused
            reused = not handle.created
            progress.reused += reused
            self._write_state(item.key, item_hash, reused, state, progress, listed=False)
        else:
            progress.reused += not handle.created
            self.in_flight[handle.turn_id] = (item.key, item_hash, not handle.created)
            # listed in Redis too, so `stepq approve --batch` finds the batch's parked turns from anywhere
            self.rt.redis.hset(
                self.rt.keys.batch_inflight(self.batch_id), handle.turn_id, json.dumps([0, item.key, item_hash])
            )

    def _collect(self, cursor: str, progress: Progress) -> str:
        stream = self.rt.keys.batch_done(self.batch_id)
        replies = cast(
            list[tuple[str, list[tuple[str, dict[str, str]]]]] | None,
            self.rt.redis.xread({stream: cursor}, count=500, block=500),
        )
        seen = False
        for _, entries in replies or []:
            for entry_id, fields in entries:
                cursor = entry_id
                entry = self.in_flight.pop(fields["turn_id"], None)
                if entry is not None:
                    seen = True
                    state = self.client.get(fields["turn_id"])
                    self._write_state(*entry, state, progress)
        if not seen:
            self._poll_in_flight(progress)
        return cursor

    def _poll_in_flight(self, progress: Progress) -> None:
        """On a quiet stream, read in-flight states: catches ends the stream missed, and counts retries."""
        ids = list(self.in_flight)
        if not ids:
            return
        raws = get_many(self.rt.redis, [self.rt.keys.turn(t) for t in ids])
        retrying = awaiting = 0
        for turn_id, raw in zip(ids, raws, strict=True):
            if raw is None:
                continue
            state = TurnState.model_validate_json(raw)
            if state.status.terminal:
                self._write_state(*self.in_flight.pop(turn_id), state, progress)
            elif state.status == TurnStatus.AWAITING_APPROVAL:
                awaiting += 1
            elif state.attempt > 0:
                retrying += 1
        progress.retrying = retrying
        progress.awaiting = awaiting

    def _write_state(
        self, key: str, item_hash: str, reused: bool, state: TurnState, progress: Progress, listed: bool = True
    ) -> None:
        if listed:
            self.rt.redis.hdel(self.rt.keys.batch_inflight(self.batch_id), state.turn_id)
        if not reused:  # an earlier run's turn was paid for then: this run's tokens and cost are its own turns'
            progress.input_tokens += state.usage.input_tokens
            progress.output_tokens += state.usage.output_tokens
            # the turn's stored cost: its cached tokens, failed attempts and each step's model already priced
            progress.cost = add_costs(progress.cost, state.cost)
        line = result_line(key, state, item_hash=item_hash, reused=reused)
        self._write(line, progress, failed=state.status != TurnStatus.COMPLETED)

    def _write(self, record: dict[str, Any], progress: Progress, failed: bool) -> None:
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()
        if failed:
            progress.failed += 1
        else:
            progress.done += 1

    def _render(self, progress: Progress, force: bool = False) -> None:
        if self.progress_stream is None:
            return
        now = time.monotonic()
        if not force and now - self._last_render < 0.5:
            return
        self._last_render = now
        end = "\n" if force or not self.progress_stream.isatty() else "\r"
        self.progress_stream.write(progress.line() + end)
        self.progress_stream.flush()


def summary(progress: Progress, batch_id: str, output: Path) -> str:
    parts = [
        f"batch {batch_id}: {progress.done} completed, {progress.failed} failed in this run; "
        f"{progress.skipped} from earlier runs ({progress.skipped_failed} failed); "
        f"{progress.reused} reused (unchanged, answered before); {progress.total} items",
        f"tokens in this run: {progress.input_tokens} in, {progress.output_tokens} out (reused items cost nothing)",
    ]
    if progress.cost is not None:
        parts.append(f"cost: {money(progress.cost)}")
    parts.append(f"results: {output}")
    return "\n".join(parts)


def run_batch_command(
    client: Client,
    agent: str,
    input_path: Path,
    output_path: Path,
    *,
    resume: bool,
    concurrency: int,
    batch_id: str | None,
    on_duplicate: str = "refuse",
) -> int:
    """The body of `stepq batch`; returns the exit code."""
    if (problem := input_problem(input_path)) is not None:
        print(f"stepq batch: {problem}", file=sys.stderr)
        return 2
    if not output_path.parent.is_dir():
        print(
            f"stepq batch: no folder {output_path.parent} for --output {output_path}: create it first", file=sys.stderr
        )
        return 2
    if client.runtime.agents.get(agent) is None:
        print(f"stepq batch: unknown agent {agent!r}", file=sys.stderr)
        return 2
    client.runtime.redis.ping()  # Redis unreachable: one error line now, before the output file is touched
    # refused (ValueError, one line) before the output file is opened: a bad id must not truncate earlier results
    batch_id = check_batch_id(batch_id or derive_batch_id(agent, str(input_path.resolve())))
    items = read_input(input_path, on_duplicate)
    current = {key: item.content_hash() for key, item, _ in items if item is not None}
    try:
        skip = finished_keys(output_path, current) if resume else {}
        out_file = output_path.open("a" if resume else "w", encoding="utf-8")
    except OSError as exc:
        print(f"stepq batch: cannot write --output {output_path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"batch {batch_id}: {len(items)} items, {len(skip)} already done", file=sys.stderr)
    with out_file as out:
        runner = BatchRunner(client, agent, batch_id, out, concurrency, progress_stream=sys.stderr)
        try:
            progress = runner.run(items, skip)
        except KeyboardInterrupt:
            print(f"\ninterrupted; re-run with --resume to finish batch {batch_id}", file=sys.stderr)
            return 130
    print(summary(progress, batch_id, output_path), file=sys.stderr)
    return 0 if progress.failed + progress.skipped_failed == 0 else 1


def batch_status(client: Client, batch_id: str) -> dict[str, Any]:
    """Counters for a batch running anywhere, with the in-flight turns awaiting approval."""
    return batch_driver.status(client.runtime, check_batch_id(batch_id))


def status_line(status: dict[str, Any]) -> str:
    return (
        f"batch {status['batch_id']}: {status['finished']}/{status['total']} done={status['done']} "
        f"failed={status['failed']} running={status['running']} retrying={status['retrying']} "
        f"awaiting approval={status['awaiting_approval']} reused={status.get('reused', 0)}"
        + (f" ({status['state']})" if "state" in status else "")
    )


def submit_command(client: Client, ns: Any) -> int:
    """`stepq batch submit`: store the items for the workers' batch driver and return at once."""
    if client.settings.embedded:
        print(
            "stepq batch submit: needs a shared Redis and `stepq worker` (set STEPQ_REDIS_URL); "
            "in embedded mode run `stepq batch --agent … --input … --output …` instead",
            file=sys.stderr,
        )
        return 2
    if (problem := input_problem(ns.input)) is not None:
        print(f"stepq batch submit: {problem}", file=sys.stderr)
        return 2
    if client.runtime.agents.get(ns.agent) is None:
        print(f"stepq batch submit: unknown agent {ns.agent!r}", file=sys.stderr)
        return 2
    batch_id = check_batch_id(ns.batch_id or derive_batch_id(ns.agent, str(ns.input.resolve())))
    items = read_input(ns.input, ns.on_duplicate)
    counts = batch_driver.store_batch(
        client.runtime, batch_id, ns.agent, items, ns.concurrency, provider_batch=ns.provider_batch
    )
    client.celery.send_task(BATCH_DRIVE, args=[batch_id], queue=queue_for(client.settings, "batch"))
    print(batch_id)
    print(
        f"batch {batch_id}: {counts['total']} items submitted ({counts['failed']} bad lines recorded as failed); "
        f"follow it with `stepq batch wait {batch_id} --output results.jsonl`",
        file=sys.stderr,
    )
    return 0


def write_results(client: Client, batch_id: str, output: Path) -> int:
    """Write a driven batch's results (one line per item) to `output` atomically; returns the line count."""
    rows = batch_driver.results(client.runtime, batch_id)
    tmp = output.with_name(f".{output.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(output)
    return len(rows)


def wait_command(client: Client, ns: Any) -> int:
    """`stepq batch wait ID`: progress until the batch is finished, then the results file if asked."""
    rt = client.runtime
    deadline = None if ns.timeout is None else time.monotonic() + ns.timeout
    cursor = "$"
    stream = rt.keys.batch_done(ns.batch_id)
    last = 0.0
    while True:
        status = batch_status(client, ns.batch_id)
        if not status.get("driven"):
            print(f"stepq batch wait: batch {ns.batch_id} runs in the foreground (`stepq batch`), not on the workers",
                  file=sys.stderr)  # fmt: skip
            return 2
        if status["state"] == "finished":
            break
        if deadline is not None and time.monotonic() > deadline:
            print(f"stepq batch wait: {status_line(status)}; not finished after {ns.timeout}s", file=sys.stderr)
            return 1
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            end = "\r" if sys.stderr.isatty() else "\n"
            sys.stderr.write(status_line(status) + end)
            sys.stderr.flush()
        # a finished turn is the news worth looking again for; approvals and the end are seen within a second
        reply = cast(list[Any] | None, rt.redis.xread({stream: cursor}, count=1000, block=1000))
        for _, entries in reply or []:
            cursor = entries[-1][0]
    print(status_line(status), file=sys.stderr)
    if ns.output is not None:
        lines = write_results(client, ns.batch_id, ns.output)
        print(f"results: {ns.output} ({lines} lines)", file=sys.stderr)
    return 0 if status["failed"] == 0 else 1


def results_command(client: Client, ns: Any) -> int:
    status = batch_status(client, ns.batch_id)
    if not status.get("driven"):
        print(f"stepq batch results: batch {ns.batch_id} ran in the foreground: its results are in its --output file",
              file=sys.stderr)  # fmt: skip
        return 2
    if status["state"] != "finished" and not ns.partial:
        print(
            f"stepq batch results: {status_line(status)}: not finished; `stepq batch wait {ns.batch_id}` first, "
            "or --partial for the results so far",
            file=sys.stderr,
        )
        return 1
    lines = write_results(client, ns.batch_id, ns.output)
    print(f"results: {ns.output} ({lines} lines of {status['total']})", file=sys.stderr)
    return 0


def parked_approvals(client: Client, batch_id: str, filters: list[str]) -> list[tuple[str, str, str]]:
    """(approval id, item key, tool) of the batch's parked turns' pending approvals matching every filter."""
    from fnmatch import fnmatchcase

    wanted: list[tuple[str, str]] = []
    for expr in filters:
        name, sep, value = expr.partition("=")
        if not sep or name not in ("tool", "key") or not value:
            raise ValueError(f"--filter {expr!r}: write tool=NAME or key=GLOB")
        wanted.append((name, value))
    rt = client.runtime
    turn_ids = cast(list[str], rt.redis.hkeys(rt.keys.batch_inflight(check_batch_id(batch_id))))
    found: list[tuple[str, str, str]] = []
    for start in range(0, len(turn_ids), 500):
        for blob in get_many(rt.redis, [rt.keys.turn(t) for t in turn_ids[start : start + 500]]):
            if blob is None:
                continue
            state = TurnState.model_validate_json(blob)
            if state.status != TurnStatus.AWAITING_APPROVAL or state.parked is None:
                continue
            key = str(state.metadata.get("item_key", ""))
            for pending in state.parked.approvals:
                fields = {"tool": pending.tool_name, "key": key}
                if all(fnmatchcase(fields[name], value) for name, value in wanted):
                    found.append((pending.approval_id, key, pending.tool_name))
    return found


def approve_batch_command(client: Client, args: Any) -> int:
    """`stepq approve --batch ID --all|--filter … --yes|--no`: every decision goes through the `approve`
    task's own checks (token, single use, turn still waiting), as one `stepq approve` would."""
    if not args.all and not args.filter:
        print("stepq approve --batch: say which approvals: --all, or --filter tool=NAME / key=GLOB", file=sys.stderr)
        return 2
    if args.approval_id is not None:
        print("stepq approve --batch: takes no APPROVAL_ID (it decides the batch's pending approvals)", file=sys.stderr)
        return 2
    try:
        batch_status(client, args.batch)  # an unknown batch is an error, not "approved 0"
        found = parked_approvals(client, args.batch, args.filter)
    except (ValueError, LookupError) as exc:
        print(f"stepq approve --batch: {exc}", file=sys.stderr)
        return 2
    approved = bool(args.yes)
    receipts = [
        (key, client.approve(approval_id, approved, reason=args.reason, reviewer=args.reviewer))
        for approval_id, key, _ in found
    ]
    accepted = 0
    refused: Counter[str] = Counter()
    deadline = time.monotonic() + args.timeout
    for key, receipt in receipts:
        try:
            receipt.wait(timeout=max(0.1, deadline - time.monotonic()))
            accepted += 1
        except ApprovalError as exc:
            refused[str(exc.code)] += 1
            print(f"refused ({exc.code}) for item {key}: {exc}", file=sys.stderr)
        except WaitTimeoutError:
            refused["no answer from a worker"] += 1
    verb = "approved" if approved else "denied"
    reasons = f" ({', '.join(f'{n} {code}' for code, n in sorted(refused.items()))})" if refused else ""
    print(f"batch {args.batch}: {verb} {accepted}, refused {sum(refused.values())}{reasons}")
    return 0 if not refused else 1


FOLLOW_COMMANDS = ("submit", "status", "wait", "results")


def follow_parser(command: str) -> argparse.ArgumentParser:
    """The parser of `stepq batch <command>` (one of FOLLOW_COMMANDS; the CLI reference is generated from it)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"stepq batch {command}")
    if command == "submit":
        parser.add_argument("--agent", required=True)
        parser.add_argument("--input", required=True, type=Path, help="JSONL: {key, prompt|messages|input} per line")
        parser.add_argument("--concurrency", type=int, default=64, help="turns in flight at once")
        parser.add_argument("--batch-id", default=None, help="default: derived from the agent and the input path")
        parser.add_argument("--on-duplicate", choices=ON_DUPLICATE, default="refuse")
        parser.add_argument(
            "--provider-batch",
            action="store_true",
            help="send each step's model request through the provider's batch API (about half price, "
            "answered within hours; needs the provider-batch tick on the workers' beat)",
        )
    else:
        parser.add_argument("batch_id")
    if command == "status":
        parser.add_argument("--json", action="store_true")
    if command == "wait":
        parser.add_argument("--output", type=Path, default=None, help="write the results here once finished")
        parser.add_argument("--timeout", type=seconds, default=None, help="seconds; default: wait as long as it takes")
    if command == "results":
        parser.add_argument("--output", required=True, type=Path)
        parser.add_argument("--partial", action="store_true", help="write the results so far of a running batch")
    return parser


def _follow_main(command: str, args_list: list[str]) -> int:
    """`stepq batch status|wait|results|submit …`."""
    parser = follow_parser(command)
    ns = parser.parse_args(args_list)
    if command == "submit" and ns.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    output = getattr(ns, "output", None)
    if output is not None and not output.parent.is_dir():
        print(f"stepq batch {command}: no folder {output.parent} for --output {output}: create it first",
              file=sys.stderr)  # fmt: skip
        return 2
    if output is not None and output.is_dir():
        print(f"stepq batch {command}: --output {output} is a folder; give the file to write", file=sys.stderr)
        return 2
    try:
        settings = load_settings()
        reach_redis(settings)  # never reached: one line within seconds, not after STEPQ_REDIS_OUTAGE_S
        client = Client(settings)
        with client:
            if command == "submit":
                return submit_command(client, ns)
            if command == "wait":
                return wait_command(client, ns)
            if command == "results":
                return results_command(client, ns)
            status = batch_status(client, ns.batch_id)
            if ns.json:
                print(json.dumps(status))
            else:
                for name, value in status.items():
                    print(f"{name:>17}: {value}")
            return 0
    except (UsageError, LookupError, ValueError, SubmitError) as exc:
        print(f"stepq batch {command}: {exc}", file=sys.stderr)
        return 2


def batch_parser() -> argparse.ArgumentParser:
    """The parser of `stepq batch` itself (the CLI reference is generated from it)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="stepq batch",
        description="Run a JSONL file of items through an agent. `stepq batch submit|status|wait|results` "
        "run it on the workers instead (see `stepq batch submit --help`).",
    )
    parser.add_argument("--agent", required=True)
    parser.add_argument("--input", required=True, type=Path, help="JSONL: {key, prompt|messages|input} per line")
    parser.add_argument("--output", required=True, type=Path, help="JSONL results, one line per item")
    parser.add_argument("--resume", action="store_true", help="skip items already in --output (same content)")
    parser.add_argument("--concurrency", type=int, default=64, help="turns in flight at once")
    parser.add_argument("--batch-id", default=None, help="default: derived from the agent and the input path")
    parser.add_argument(
        "--on-duplicate",
        choices=ON_DUPLICATE,
        default="refuse",
        help="a key on several lines: refuse the file (default, naming the lines), or keep its first or last line",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """`stepq batch --agent A --input items.jsonl --output results.jsonl`, or `stepq batch submit|status|wait|results`."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] and args_list[0] in FOLLOW_COMMANDS:
        return _follow_main(args_list[0], args_list[1:])
    parser = batch_parser()
    ns = parser.parse_args(args_list)
    if ns.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    try:
        settings = load_settings()
    except UsageError as exc:
        print(f"stepq batch: {exc}", file=sys.stderr)
        return 2
    reach_redis(settings)  # never reached: one line within seconds, not after STEPQ_REDIS_OUTAGE_S
    client = Client(settings)  # loads the agent modules: one that fails to import stops here, before any worker
    # embedded mode has no separate worker: run one in this process for the batch's duration
    with client, local_worker(settings) if settings.embedded else nullcontext():
        try:
            return run_batch_command(
                client,
                ns.agent,
                ns.input,
                ns.output,
                resume=ns.resume,
                concurrency=ns.concurrency,
                batch_id=ns.batch_id,
                on_duplicate=ns.on_duplicate,
            )
        except ValueError as exc:
            print(f"stepq batch: {exc}", file=sys.stderr)
            return 2


if __name__ == "__main__":  # through the CLI's main: its failures are one line, never a traceback
    from stepq.producer.cli import main as cli_main

    raise SystemExit(cli_main(["batch", *sys.argv[1:]]))
