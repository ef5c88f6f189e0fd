"""Batches: resumable after an interruption, every item exactly once, nothing submitted twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from stepq.batches import driver as batch_driver
from stepq.batches.items import BatchItem, item_idempotency_key
from stepq.errors import SubmitError
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, TurnStatus
from stepq.producer.batch import read_input
from stepq.turns.submit import create_turn
from tests.conftest import ROOT, WorkerProcess, eventually, make_settings, settings_env


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
        idempotency_key=item_idempotency_key("resume-test", last),
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


def test_submit_batch_refuses_a_malformed_item_or_batch_id_naming_it_and_stores_nothing(client, prefix):
    """Before, a missing key was pydantic's ValidationError and a bad batch id a bare ValueError."""
    good = {"key": "a", "prompt": "hi"}
    before = set(client.runtime.redis.scan_iter(f"{prefix}*", count=1000))
    for items, key, said in [
        ([good, {"prompt": "no key"}], None, "items[1]: key: Field required"),
        ([good, "text"], None, "items[1]: an item must be a JSON object"),
        ([{"key": "a"}], None, "items[0]: item: an item needs exactly one of prompt, messages or input"),
        ([good], "bad id!", "a batch id is 1-100 characters of letters, digits and _ . : -"),
    ]:
        with pytest.raises(SubmitError) as info:
            client.submit_batch("bt.extract", items, key=key)
        assert str(info.value) == said
    assert set(client.runtime.redis.scan_iter(f"{prefix}*", count=1000)) == before


def test_an_input_file_saved_with_a_bom_reads_and_a_line_that_is_not_utf8_fails_alone(tmp_path):
    """Some editors start UTF-8 files with a byte-order mark; a line of another encoding is that item's failure
    (named by its line), not the whole run's: before, the first made line 1 'not JSON' and the second ended
    the command with the codec's message and no line number."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"key": "a", "prompt": "hi"}\n\xff\xfe{"key": "b"}\n{"key": "c", "prompt": "caf\xc3\xa9"}\n'
    )
    read = [(key, item.prompt if item else None, error) for key, item, error in read_input(path)]
    assert read == [
        ("a", "hi", None),
        ("line-2", None, "line 2: not UTF-8 text (invalid start byte at byte 0)"),
        ("c", "café", None),
    ]


def test_a_bad_batch_id_is_refused_before_the_output_file_is_touched(settings, tmp_path):
    """Before, the output was opened (truncated) first: a typo in --batch-id lost the earlier run's results."""
    (tmp_path / "in.jsonl").write_text('{"key": "a", "prompt": "hi"}\n')
    earlier = '{"key": "a", "status": "completed"}\n'
    (tmp_path / "out.jsonl").write_text(earlier)
    args = ["--agent", "bt.extract", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]
    proc = _batch(settings, *args, "--batch-id", "bad id")
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.strip()) == (
        2,
        "stepq batch: a batch id is 1-100 characters of letters, digits and _ . : -",
    )
    assert (tmp_path / "out.jsonl").read_text() == earlier


def test_unknown_agent_and_missing_input_are_clear_errors(settings, tmp_path):
    proc = _batch(settings, "--agent", "bt.nope", "--input", str(tmp_path / "x.jsonl"), "--output", str(tmp_path / "o"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no input file" in err
    for command in (["--agent", "bt.extract", "--output", str(tmp_path / "o")], ["submit", "--agent", "bt.extract"]):
        proc = _batch(settings, *command, "--input", str(tmp_path))  # a folder given as the input
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and err.strip().endswith(f"--input {tmp_path} is a folder, not a JSONL file"), err
    proc = _batch(settings, "results", "b-1", "--output", str(tmp_path))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.strip().endswith(f"--output {tmp_path} is a folder; give the file to write"), (
        err
    )
    (tmp_path / "x.jsonl").write_text("{}\n")
    proc = _batch(settings, "--agent", "bt.nope", "--input", str(tmp_path / "x.jsonl"), "--output", str(tmp_path / "o"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "unknown agent 'bt.nope'" in err


def _cli(settings, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "stepq.producer.cli", *args],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _contact(i, who="Contact"):
    return {"key": f"item-{i}", "input": {"text": f"{who} {i} <c{i}@example.com>"}}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_edited_item_is_a_new_turn_and_unchanged_items_are_reused(settings, worker, client, tmp_path):
    items, out = tmp_path / "items.jsonl", tmp_path / "results.jsonl"
    _write(items, [_contact(i) for i in range(6)])
    args = ["--agent", "bt.extract", "--input", str(items), "--output", str(out), "--batch-id", "edit-test"]
    first = _batch(settings, *args)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    before = {r["key"]: r for r in _lines(out)}
    assert not any(r["reused"] for r in before.values())
    assert "tokens in this run: 0 in" not in err  # six new turns were paid for

    _write(items, [_contact(i, who="Edited" if i == 2 else "Contact") for i in range(6)])
    second = _batch(settings, *args)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    after = {r["key"]: r for r in _lines(out)}
    assert len(after) == 6
    assert after["item-2"]["object"] == {"name": "Edited 2", "email": "c2@example.com"}  # not the old answer
    assert after["item-2"]["turn_id"] != before["item-2"]["turn_id"] and not after["item-2"]["reused"]
    for key in ("item-0", "item-1", "item-3", "item-4", "item-5"):
        assert after[key]["reused"] and after[key]["turn_id"] == before[key]["turn_id"]
    assert "5 reused" in err
    edited = after["item-2"]["usage"]  # only the edited item ran (and cost anything) in this run
    assert f"tokens in this run: {edited['input_tokens']} in, {edited['output_tokens']} out" in err, err
    unchanged = _batch(settings, *args)  # nothing edited: every item reused, nothing paid
    _, err = unchanged.communicate(timeout=300)
    assert unchanged.returncode == 0 and "6 reused" in err and "tokens in this run: 0 in, 0 out" in err, err
    assert int(client.runtime.redis.hget(client.runtime.keys.batch("edit-test"), "created")) == 7

    # the same through the workers' driver: the unchanged items are reused, the edited one runs
    _write(items, [_contact(i, who="Again" if i == 4 else "Contact") for i in range(6)])
    submit = _cli(
        settings, "batch", "submit", "--agent", "bt.extract", "--input", str(items), "--batch-id", "edit-test"
    )
    assert submit.returncode == 0, submit.stderr
    done = _cli(settings, "batch", "wait", "edit-test", "--output", str(out))
    assert done.returncode == 0, done.stderr
    rows = {r["key"]: r for r in _lines(out)}
    assert rows["item-4"]["object"]["name"] == "Again 4" and not rows["item-4"]["reused"]
    assert sum(r["reused"] for r in rows.values()) == 5 and "reused=5" in done.stderr


def test_duplicate_keys_are_refused_with_their_lines(settings, worker, tmp_path):
    items, out = tmp_path / "items.jsonl", tmp_path / "results.jsonl"
    rows = [_contact(0), _contact(1), _contact(0, who="Other"), _contact(2), _contact(1, who="Last")]
    _write(items, rows)
    args = ["--agent", "bt.extract", "--input", str(items), "--output", str(out)]
    refused = _batch(settings, *args)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2, err
    assert "'item-0' on lines 1, 3" in err and "'item-1' on lines 2, 5" in err and "Traceback" not in err
    assert not out.exists()
    submit = _cli(settings, "batch", "submit", "--agent", "bt.extract", "--input", str(items))
    assert submit.returncode == 2 and "'item-0' on lines 1, 3" in submit.stderr, submit.stderr

    last = _batch(settings, *args, "--on-duplicate", "last")
    _, err = last.communicate(timeout=300)
    assert last.returncode == 0, err
    by_key = {r["key"]: r for r in _lines(out)}
    assert len(_lines(out)) == 3
    assert by_key["item-0"]["object"]["name"] == "Other 0" and by_key["item-1"]["object"]["name"] == "Last 1"


def test_bulk_approve_decides_every_parked_item_once(settings, client, tmp_path):
    worker = WorkerProcess(settings, "bulk", concurrency=4)
    try:
        items = tmp_path / "items.jsonl"
        _write(items, [{"key": f"g-{i}", "prompt": f"publish {i}"} for i in range(100)])
        submit = _cli(settings, "batch", "submit", "--agent", "bt.gated", "--input", str(items),
                      "--concurrency", "100", "--batch-id", "gated")  # fmt: skip
        assert submit.returncode == 0, submit.stderr

        def parked():
            status = json.loads(_cli(settings, "batch", "status", "gated", "--json").stdout)
            return status["awaiting_approval"] == 100

        eventually(parked, timeout=180, what="100 items awaiting approval")
        progress = _cli(settings, "batch", "status", "gated")
        assert "awaiting_approval: 100" in progress.stdout
        decided = _cli(
            settings, "approve", "--batch", "gated", "--all", "--yes", "--reviewer", "ops", "--timeout", "120"
        )
        assert decided.returncode == 0, decided.stderr
        assert "approved 100, refused 0" in decided.stdout
        done = _cli(settings, "batch", "wait", "gated", "--output", str(tmp_path / "out.jsonl"))
        assert done.returncode == 0, done.stderr
        rows = _lines(tmp_path / "out.jsonl")
        assert len(rows) == 100 and {r["status"] for r in rows} == {"completed"}
        rt = client.runtime
        for row in rows:  # each approval decided once, by the bulk reviewer, and its tool ran once
            state = client.get(row["turn_id"])
            calls = [e for e in client.events(row["turn_id"], idle_timeout=60) if e.type == EventType.APPROVAL_DECISION]
            assert len(calls) == 1 and calls[0].data["decision"] == "approved"
            record = rt.approvals.get(calls[0].data["approval_id"])
            assert record.status == "approved" and record.reviewer == "ops"
            assert rt.redis.hlen(rt.keys.tool_results(state.turn_id)) == 1
        again = _cli(settings, "approve", "--batch", "gated", "--all", "--yes")
        assert again.returncode == 0 and "approved 0, refused 0" in again.stdout
    finally:
        worker.stop()


def test_submitted_batch_survives_its_cli_and_wait_returns_each_result_once(settings, client, tmp_path):
    items, out = tmp_path / "items.jsonl", tmp_path / "results.jsonl"
    _write_items(items, 120, bad_lines={5})
    submit = _cli(settings, "batch", "submit", "--agent", "bt.extract", "--input", str(items),
                  "--concurrency", "20", "--batch-id", "detached")  # fmt: skip
    assert submit.returncode == 0, submit.stderr  # returns at once: no worker is even running yet
    assert submit.stdout.strip() == "detached"
    follower = subprocess.Popen(
        [sys.executable, "-m", "stepq.producer.cli", "batch", "wait", "detached", "--output", str(out)],
        env=settings_env(settings), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert "batch detached: " in follower.stderr.readline()  # it follows the batch
    follower.send_signal(signal.SIGKILL)  # the CLI dies; the batch lives in Redis and on the workers
    follower.wait(timeout=30)
    assert not out.exists()
    worker = WorkerProcess(settings, "driver", concurrency=4)
    try:

        def some_done():
            return json.loads(_cli(settings, "batch", "status", "detached", "--json").stdout)["finished"] >= 15

        eventually(some_done, timeout=180, what="15 results")
        worker.kill()  # kill -9 a worker that drives the batch: the driver's state is in Redis
        worker = WorkerProcess(settings, "driver2", concurrency=4)
        # under the test's own timeout, so a hang fails here with the batch's status and the workers' logs
        done = _cli(settings, "batch", "wait", "detached", "--output", str(out), "--timeout", "150")
        status = _cli(settings, "batch", "status", "detached", "--json").stdout
        assert done.returncode == 1, f"{done.stderr}\nstatus: {status}"  # the bad line is a failed item
        rows = _lines(out)
        keys = [r["key"] for r in rows]
        assert len(keys) == 120 and len(set(keys)) == 120
        by_key = {r["key"]: r for r in rows}
        assert by_key["bad-5"]["status"] == "failed" and "prompt" in by_key["bad-5"]["error"]
        assert by_key["item-77"]["object"] == {"name": "Contact 77", "email": "c77@example.com"}
        assert sum(r["status"] == "completed" for r in rows) == 119
        record = client.runtime.redis.hgetall(client.runtime.keys.batch("detached"))
        assert int(record["created"]) == 119  # no item submitted twice
        again = _cli(settings, "batch", "results", "detached", "--output", str(tmp_path / "again.jsonl"))
        assert again.returncode == 0 and _lines(tmp_path / "again.jsonl") == rows
    finally:
        worker.stop()


def test_items_a_killed_driver_placed_but_never_sent_are_sent_by_the_sweeper(prefix, tmp_path):
    """A driver pass creates each item's turn, moves the cursor, then sends the turn's first step; a worker
    killed in between leaves turns no message names. They count as unsent until sent, so the sweeper sends
    them within a lease TTL, not after STEPQ_QUEUED_GRACE_S (an hour here: the batch would hang)."""
    settings = make_settings(prefix, queued_grace_s=3600)
    rt = get_runtime(settings)
    items = [(f"item-{i}", BatchItem.model_validate(_contact(i)), None) for i in range(12)]
    batch_driver.store_batch(rt, "orphans", "bt.extract", items, concurrency=12)
    plan = batch_driver.drive(rt, "orphans")  # placed, never sent: as if its worker died right after the pass
    assert len(plan.send) == 12 and batch_driver.status(rt, "orphans")["created"] == 12
    worker = WorkerProcess(settings, "sweeps", concurrency=2)
    try:
        out = tmp_path / "out.jsonl"
        done = _cli(settings, "batch", "wait", "orphans", "--output", str(out), "--timeout", "120")
        assert done.returncode == 0, done.stderr
        rows = _lines(out)
        assert sorted(r["key"] for r in rows) == sorted(key for key, _, _ in items)
        assert {r["status"] for r in rows} == {"completed"}
        assert int(rt.redis.hget(rt.keys.batch("orphans"), "created")) == 12  # each sent, none created twice
    finally:
        worker.stop()


def test_a_driven_batch_runs_its_next_items_inline_on_the_worker_that_ended_a_turn(prefix, tmp_path):
    """The worker whose batch turn ended places the next item and runs it in the same task, not through the
    broker: such a turn's step 0 was never sent (its sent marker stays at -1). Every item still ends once."""
    settings = make_settings(prefix)
    rt = get_runtime(settings)
    items, out = tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    _write_items(items, 40)
    worker = WorkerProcess(settings, "inline", concurrency=1)
    try:
        submit = _cli(settings, "batch", "submit", "--agent", "bt.extract", "--input", str(items),
                      "--concurrency", "4", "--batch-id", "inline")  # fmt: skip
        assert submit.returncode == 0, submit.stderr
        done = _cli(settings, "batch", "wait", "inline", "--output", str(out), "--timeout", "120")
        assert done.returncode == 0, done.stderr
        rows = _lines(out)
        assert len(rows) == 40 and len({r["key"] for r in rows}) == 40
        assert {r["status"] for r in rows} == {"completed"}
        assert int(rt.redis.hget(rt.keys.batch("inline"), "created")) == 40  # none created twice
        inline = [r["turn_id"] for r in rows if rt.turns.sent_step(r["turn_id"]) == -1]
        assert inline, "no item ran inline: every one went through the broker"
    finally:
        worker.stop()


def test_a_turn_end_writes_its_result_and_the_tick_records_one_whose_worker_died_first(prefix, monkeypatch):
    """A driven batch turn's end writes the item's result line in the script that counts the turn (no pass
    collects it); a turn whose worker died between its final commit and that script is recorded by the tick.
    Each line equals `result_line` of the turn, written once, in input order."""
    from stepq.batches.items import result_line
    from stepq.engine.runner import StepRunner
    from stepq.store.batch_runs import BatchRunStore, TurnEnd

    rt = get_runtime(make_settings(prefix))
    rows = [{"key": "clé-0", "input": {"text": "Zoë 0 <z0@example.com>"}}, _contact(1), _contact(2)]
    items = [(r["key"], BatchItem.model_validate(r), None) for r in rows]
    batch_driver.store_batch(rt, "ends", "bt.extract", items, concurrency=3)
    plan = batch_driver.drive(rt, "ends", full_check=True)
    turns = [turn_id for turn_id, _ in plan.send]
    assert len(turns) == 3

    def run(turn_id):
        decision = StepRunner(rt).deliver(turn_id, 0)
        assert decision.action == "none", decision
        return decision

    assert run(turns[0]).batch == "ends"  # written and flagged: the worker drives right after
    [first] = batch_driver.results(rt, "ends")
    state = rt.turns.load(turns[0])
    assert first == result_line("clé-0", state, item_hash=items[0][1].content_hash())
    assert first["object"]["name"] == "Zoë 0"
    assert batch_driver.status(rt, "ends")["done"] == 1

    with monkeypatch.context() as m:  # the worker dies right after the turn's final commit
        m.setattr(BatchRunStore, "turn_ended", lambda self, batch_id, state, result: TurnEnd(False))
        assert run(turns[1]).batch == ""
    assert len(batch_driver.results(rt, "ends")) == 1
    run(turns[2])
    assert batch_driver.drive(rt, "ends").finished is False  # the dead worker's turn is still listed
    batch_driver.wake(rt, "ends")
    assert batch_driver.drive(rt, "ends", full_check=True).finished  # the tick records it: nothing left
    final = batch_driver.results(rt, "ends")
    assert [r["key"] for r in final] == ["clé-0", "item-1", "item-2"]
    assert {r["status"] for r in final} == {"completed"} and not any(r["reused"] for r in final)
    status = batch_driver.status(rt, "ends")
    assert (status["done"], status["failed"], status["state"]) == (3, 0, "finished")


def test_an_item_claimed_by_a_worker_that_died_is_placed_by_the_tick_after_a_lease_ttl(prefix):
    """A batch turn's end claims the next item for its worker, which creates and runs it. A worker that dies
    before listing the item's turn leaves only the claim: the tick leaves a fresh claim alone and places a
    claim older than a lease TTL, once."""
    from stepq.engine.runner import StepRunner

    rt = get_runtime(make_settings(prefix, lease_ttl_s=1.0))
    items = [(f"item-{i}", BatchItem.model_validate(_contact(i)), None) for i in range(3)]
    batch_driver.store_batch(rt, "claims", "bt.extract", items, concurrency=1)
    [(first, _)] = batch_driver.drive(rt, "claims", full_check=True).send

    def tick():
        batch_driver.wake(rt, "claims")
        return batch_driver.drive(rt, "claims", full_check=True)

    decision = StepRunner(rt).deliver(first, 0)
    assert decision.claim is not None and decision.claim.index == 1  # claimed for this worker, which now dies
    assert rt.redis.hexists(rt.keys.batch_inflight("claims"), "claim:1")
    assert tick().send == []  # a fresh claim: its worker may still be placing it
    placed: list[tuple[str, str]] = []
    eventually(lambda: placed.extend(tick().send) or placed, timeout=60, what="the tick to place the stale claim")
    [(second, _)] = placed
    assert not rt.redis.hexists(rt.keys.batch_inflight("claims"), "claim:1")

    ended = StepRunner(rt).deliver(second, 0)
    assert ended.claim is not None and ended.claim.index == 2
    third = batch_driver.run_claim(rt, ended.claim)  # a live worker creates, lists and runs its claim
    assert third is not None
    last = StepRunner(rt).deliver(third[0], 0)
    assert last.claim is None and last.batch == "claims"
    assert batch_driver.drive(rt, "claims").finished
    rows = batch_driver.results(rt, "claims")
    assert [r["key"] for r in rows] == ["item-0", "item-1", "item-2"] and {r["status"] for r in rows} == {"completed"}
    assert int(rt.redis.hget(rt.keys.batch("claims"), "created")) == 3
