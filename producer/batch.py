"""`stepq batch`: push a JSONL file of items through one agent, write JSONL results, resumably.

Each item becomes a turn keyed by (batch id, item key), so a re-run after an
interruption re-uses turns that exist instead of submitting (and paying for) them
again; with --resume, items already in the output file are skipped. A bad item is
written as failed with its reason and never stops the batch.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from stepq.batch import (
    BatchItem,
    check_batch_id,
    derive_batch_id,
    item_idempotency_key,
    parse_item,
    result_line,
)
from stepq.errors import SubmitError
from stepq.models import TurnState, TurnStatus
from stepq.producer.client import Client


@dataclass
class Progress:
    total: int
    skipped: int = 0
    skipped_failed: int = 0
    done: int = 0
    failed: int = 0
    retrying: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
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
            f"retrying={self.retrying} {rate:.1f} items/s ETA {eta}"
        )


ItemLine = tuple[str, BatchItem | None, str | None]  # (key, item or None, error or None)


def read_items(path: Path) -> Iterator[ItemLine]:
    """One entry per non-blank line; a bad line keeps its own key when it has one, else `line-N`."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = parse_item(line, number)
                yield item.key, item, None
            except ValueError as exc:
                yield _raw_key(line) or f"line-{number}", None, str(exc)


def _raw_key(line: str) -> str | None:
    try:
        key = json.loads(line).get("key")
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) and key else None


def finished_keys(path: Path) -> dict[str, str]:
    """Key -> status for items already in an output file. A torn last line (a crash mid-write) is cut off."""
    if not path.exists():
        return {}
    keys: dict[str, str] = {}
    good_bytes = 0
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                row = json.loads(raw)
                keys[row["key"]] = row.get("status", "")
            except (ValueError, KeyError):
                break
            good_bytes += len(raw)
    with path.open("rb+") as handle:
        handle.truncate(good_bytes)
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
        self.in_flight: dict[str, str] = {}  # turn id -> item key
        self._last_render = 0.0
        self._prices = client.settings.prices  # validated at start (STEPQ_PRICES)

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
                idempotency_key=item_idempotency_key(self.batch_id, item.key),
                metadata={**item.metadata, "batch_id": self.batch_id, "item_key": item.key},
                priority="batch",
            )
        except SubmitError as exc:
            self._write({"key": item.key, "status": "failed", "error": str(exc)}, progress, failed=True)
            return
        state = self.client.get(handle.turn_id)
        if state.status.terminal:  # finished in an earlier run: written now, not paid for again
            self._write_state(item.key, state, progress)
        else:
            self.in_flight[handle.turn_id] = item.key

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
                key = self.in_flight.pop(fields["turn_id"], None)
                if key is not None:
                    seen = True
                    state = self.client.get(fields["turn_id"])
                    self._write_state(key, state, progress)
        if not seen:
            self._poll_in_flight(progress)
        return cursor

    def _poll_in_flight(self, progress: Progress) -> None:
        """On a quiet stream, read in-flight states: catches ends the stream missed, and counts retries."""
        ids = list(self.in_flight)
        if not ids:
            return
        raws = self.rt.redis.mget([self.rt.keys.turn(t) for t in ids])
        retrying = 0
        for turn_id, raw in zip(ids, raws, strict=True):
            if raw is None:
                continue
            state = TurnState.model_validate_json(raw)
            if state.status.terminal:
                self._write_state(self.in_flight.pop(turn_id), state, progress)
            elif state.attempt > 0:
                retrying += 1
        progress.retrying = retrying

    def _write_state(self, key: str, state: TurnState, progress: Progress) -> None:
        progress.input_tokens += state.usage.input_tokens
        progress.output_tokens += state.usage.output_tokens
        prices = self._prices.get(f"{state.provider}/{state.model}")
        if prices is not None:
            progress.cost += prices.cost(state.usage.input_tokens, state.usage.output_tokens)
        self._write(result_line(key, state), progress, failed=state.status != TurnStatus.COMPLETED)

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
        f"{progress.skipped} from earlier runs ({progress.skipped_failed} failed); {progress.total} items",
        f"tokens: {progress.input_tokens} in, {progress.output_tokens} out",
    ]
    if progress.cost:
        parts.append(f"cost: {progress.cost:.4f}")
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
) -> int:
    """The body of `stepq batch`; returns the exit code."""
    if not input_path.exists():
        print(f"stepq batch: no input file {input_path}", file=sys.stderr)
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
    batch_id = batch_id or derive_batch_id(agent, str(input_path.resolve()))
    items = list(read_items(input_path))
    try:
        skip = finished_keys(output_path) if resume else {}
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
    """Counters for a batch running anywhere."""
    rt = client.runtime
    raw = rt.redis.hgetall(rt.keys.batch(batch_id))
    if not raw:
        raise LookupError(f"no batch {batch_id!r} (unknown, or expired)")
    status: dict[str, Any] = {"batch_id": batch_id, "agent": raw.get("agent")}
    for name in ("total", "created", "done", "failed", "input_tokens", "output_tokens"):
        status[name] = int(raw.get(name, 0))
    status["finished"] = status["done"] + status["failed"]
    return status


def main(argv: list[str] | None = None) -> int:
    """`stepq batch --agent A --input items.jsonl --output results.jsonl` or `stepq batch status ID`."""
    import argparse

    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["status"]:
        status_parser = argparse.ArgumentParser(prog="stepq batch status")
        status_parser.add_argument("batch_id")
        status_parser.add_argument("--json", action="store_true")
        ns = status_parser.parse_args(args_list[1:])
        try:
            status = batch_status(Client(), ns.batch_id)
        except LookupError as exc:
            print(f"stepq batch status: {exc}", file=sys.stderr)
            return 2
        if ns.json:
            print(json.dumps(status))
        else:
            for name, value in status.items():
                print(f"{name:>14}: {value}")
        return 0
    parser = argparse.ArgumentParser(prog="stepq batch", description="Run a JSONL file of items through an agent.")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--input", required=True, type=Path, help="JSONL: {key, prompt|messages|input} per line")
    parser.add_argument("--output", required=True, type=Path, help="JSONL results, one line per item")
    parser.add_argument("--resume", action="store_true", help="skip items already in --output")
    parser.add_argument("--concurrency", type=int, default=64, help="turns in flight at once")
    parser.add_argument("--batch-id", default=None, help="default: derived from the agent and the input path")
    ns = parser.parse_args(args_list)
    if ns.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    from contextlib import nullcontext

    from stepq.embedded import local_worker
    from stepq.producer.cli import UsageError, load_settings

    try:
        settings = load_settings()
    except UsageError as exc:
        print(f"stepq batch: {exc}", file=sys.stderr)
        return 2
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
            )
        except ValueError as exc:
            print(f"stepq batch: {exc}", file=sys.stderr)
            return 2


if __name__ == "__main__":  # through the CLI's main: its failures are one line, never a traceback
    from stepq.producer.cli import main as cli_main

    raise SystemExit(cli_main(["batch", *sys.argv[1:]]))
