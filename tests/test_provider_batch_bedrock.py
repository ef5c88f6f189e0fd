"""Bedrock batch inference (Claude models) through the real boto3 `bedrock` and `s3` clients: S3 is a moto
server, the job control plane the fake in tests/fakes/bedrock_batch_server.py (it reads the input from and
writes the output to that S3). A tool turn whose two steps both go through jobs, a failed record retried
then online, and the deadline -> stop -> online. The engine is driven in-process as in
tests/test_provider_batch.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from stepq.batches import provider as provider_batches
from stepq.config.settings import Settings
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.models import EventType, TurnStatus
from tests.conftest import eventually, make_settings
from tests.fakes.anthropic_server import ErrorReply, stream, text_reply, tool_use_block
from tests.fakes.bedrock_batch_server import FakeBedrockBatch
from tests.test_provider_batch import deliver, events, run_to_end, submit

AGENT = "agents_pbatch.bedrock_tools"
BUCKET = "stepq-batch"


@pytest.fixture
def settings(prefix: str) -> Settings:
    return make_settings(prefix, provider_batch_window_s=0, retry_max_attempts=2)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, s3_server: str) -> Iterator[FakeBedrockBatch]:
    server = FakeBedrockBatch().start()
    for var in ("AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-key")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK", server.base_url)
    monkeypatch.setenv("STEPQ_BEDROCK_BATCH_BUCKET", f"s3://{BUCKET}/jobs")
    monkeypatch.setenv("STEPQ_BEDROCK_BATCH_ROLE_ARN", "arn:aws:iam::123456789012:role/bedrock-batch")
    s3 = boto3.client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket=BUCKET)
    yield server
    server.stop()


def creates(fake: FakeBedrockBatch) -> list[dict[str, object]]:
    return [r["body"] for r in fake.requests if r["method"] == "POST" and r["path"] == "/model-invocation-job"]


def test_bedrock_tool_turn_goes_through_two_jobs(rt: Runtime, fake: FakeBedrockBatch) -> None:
    fake.enqueue(
        stream(tool_use_block(0, "toolu_1", "pbatch_lookup", ['{"sku": "A-1"}']), stop_reason="tool_use"),
        text_reply("enriched A-1", input_tokens=30),
    )
    turn_id = submit(rt, agent=AGENT)
    run_to_end(rt, turn_id)
    state = rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED, state.error
    assert state.text == "enriched A-1" and [t.batch for t in state.trace.steps] == [True, True]
    jobs = creates(fake)
    assert len(jobs) == 2
    assert jobs[0]["modelId"] == "anthropic.claude-batch-test-v1:0"
    assert jobs[0]["roleArn"] == "arn:aws:iam::123456789012:role/bedrock-batch"
    uri = jobs[1]["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]  # type: ignore[index]
    assert str(uri).startswith(f"s3://{BUCKET}/jobs/")
    bucket, _, key = str(uri).removeprefix("s3://").partition("/")
    record = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    assert record["recordId"] == f"{turn_id}-1-0"
    assert record["modelInput"]["anthropic_version"] == "bedrock-2023-05-31"
    assert record["modelInput"]["messages"][-1]["content"][0]["type"] == "tool_result"
    kinds = [e.type for e in events(rt, turn_id)]
    assert kinds.count(EventType.STEP_BATCHED) == 2 and EventType.TOOL_RESULT in kinds


def test_bedrock_failed_record_is_retried_then_runs_online(rt: Runtime, fake: FakeBedrockBatch) -> None:
    fake.enqueue(ErrorReply(429, "throttling_error", "Too many tokens"), ErrorReply(500, "api_error", "Internal"))
    fake.enqueue(text_reply("never"))  # not used: the online call goes to bedrock-runtime, which has no fake here
    turn_id = submit(rt, agent=AGENT)
    deliver(rt, turn_id)
    for _ in range(4):
        report = provider_batches.tick(rt, force_flush=True)
        for turn, _step in report.resume:
            deliver(rt, turn)
    state = rt.turns.load(turn_id)
    assert state is not None and len(creates(fake)) == 2
    assert state.batch_online_step == 0  # every batch attempt failed: the step went online (and failed there)
    reasons = [e.data.get("reason", "") for e in events(rt, turn_id) if e.type == EventType.STEP_RETRY]
    assert any("running online" in r for r in reasons)


def test_bedrock_past_the_deadline_the_job_is_stopped(prefix: str, fake: FakeBedrockBatch) -> None:
    rt = get_runtime(make_settings(prefix, provider_batch_window_s=0, provider_batch_deadline_s=0.2))
    fake.jobs_end = False
    fake.enqueue(text_reply("too late"))
    turn_id = submit(rt, agent=AGENT)
    deliver(rt, turn_id)
    assert provider_batches.tick(rt).sent == 1
    eventually(lambda: provider_batches.tick(rt).expired == 1, what="the job's deadline")
    assert fake.stopped == list(fake.jobs)
