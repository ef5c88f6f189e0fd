"""Batches: resumable after an interruption, every item exactly once, nothing submitted twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from stepq.batch import BatchItem, item_idempotency_key
from stepq.models import TurnStatus
from stepq.submit import create_turn
from tests.conftest import ROOT, settings_env


def _write_items(path, n, bad_lines=()):
    with path.open("w") as f:
        for i in range(n):
            if i in bad_lines:
                f.write(json.dumps({"key": f"bad-{i}", "prompt": 5}) + "\n")
            else:
                f.write(json.dumps({"key": f"item-{i}", "input": {"text": f"Contact {i} <c{i}@example.com>"}}) + "\n")


def _batch(settings, *args):
    return subprocess.Popen(
        [sys.executable, "-m", "stepq.producer.batch", *args],
        env=settings_env(settings),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_interrupted_batch_resumes_with_each_item_exactly_once(settings, worker, client, tmp_path):
    items, out = tmp_path / "items.jsonl", tmp_path / "results.jsonl"
    _write_items(items, 500, bad_lines={7})
    args = ["--agent", "bt.extract", "--input", str(items), "--output", str(out), "--concurrency", "40"]
    first = _batch(settings, *args, "--batch-id", "resume-test")
    # interrupt once at least half the results are on disk (the file is the progress signal)
    while first.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 250:
            first.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)  # polling the output file (the only progress signal); not a timing assumption
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL, first.stderr.read()
    assert 250 <= len(_lines(out)) < 500
    # a submitter killed between storing an item's turn and sending it: the resumed run must send it
    last = BatchItem.model_validate({"key": "item-499", "input": {"text": "Contact 499 <c499@example.com>"}})
    orphan, created = create_turn(
        client.runtime, "bt.extract", prompt=last.prompt_text(), priority="batch",
        idempotency_key=item_idempotency_key("resume-test", "item-499"),
        metadata={"batch_id": "resume-test", "item_key": "item-499"},
    )  # fmt: skip
    assert created

    second = _batch(settings, *args, "--batch-id", "resume-test", "--resume")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 1, err  # one bad item failed, so the batch reports failure
    rows = _lines(out)
    keys = [r["key"] for r in rows]
    assert len(keys) == 500 and len(set(keys)) == 500
    by_key = {r["key"]: r for r in rows}
    assert by_key["bad-7"]["status"] == "failed" and "prompt" in by_key["bad-7"]["error"]
    ok = [r for r in rows if r["status"] == "completed"]
    assert len(ok) == 499
    assert by_key["item-42"]["object"] == {"name": "Contact 42", "email": "c42@example.com"}
    assert by_key["item-499"]["status"] == "completed" and client.get(orphan.turn_id).status == TurnStatus.COMPLETED
    assert all(r["usage"]["input_tokens"] > 0 for r in ok)
    record = client.runtime.redis.hgetall(client.runtime.keys.batch("resume-test"))
    assert int(record["created"]) == 499  # no item was submitted (and paid for) twice
    assert int(record["done"]) == 499
    assert "failed in this run" in err and "(1 failed)" in err

    status = subprocess.run(
        [sys.executable, "-m", "stepq.producer.batch", "status", "resume-test", "--json"],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    parsed = json.loads(status.stdout)
    assert parsed["finished"] == 499 and parsed["created"] == 499


def test_submit_batch_is_idempotent(worker, client):
    items = [{"key": f"k{i}", "input": {"text": f"Contact {i} <c{i}@example.com>"}} for i in range(5)]
    batch_id, handles = client.submit_batch("bt.extract", items, key="api-batch")
    assert batch_id == "api-batch" and all(h.created for h in handles)
    results = [h.wait(timeout=60) for h in handles]
    assert all(r.status == TurnStatus.COMPLETED for r in results)
    _, again = client.submit_batch("bt.extract", items, key="api-batch")
    assert [h.turn_id for h in again] == [h.turn_id for h in handles]
    assert not any(h.created for h in again)


def test_unknown_agent_and_missing_input_are_clear_errors(settings, tmp_path):
    proc = _batch(settings, "--agent", "bt.nope", "--input", str(tmp_path / "x.jsonl"), "--output", str(tmp_path / "o"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no input file" in err
    (tmp_path / "x.jsonl").write_text("{}\n")
    proc = _batch(settings, "--agent", "bt.nope", "--input", str(tmp_path / "x.jsonl"), "--output", str(tmp_path / "o"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "unknown agent 'bt.nope'" in err
