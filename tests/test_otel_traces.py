"""OpenTelemetry GenAI traces from real worker processes to a real OTLP/HTTP receiver (tests/otlp_receiver.py,
decoding the protobuf with opentelemetry-proto), the turn submitted through a real gateway (uvicorn) with a
W3C `traceparent`: one trace per turn, with the expected tree and attributes, however the turn retried,
failed over, parked for an approval and resumed; a worker killed mid-step leaves one trace whose re-run
step is marked, and the hooks fire once per committed step across the kill."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import redis

from stepq.models import EventType, TurnStatus
from stepq.producer.render import trace_table
from tests.agents_otel import held_runs_key, hooks_key
from tests.conftest import REDIS_URL, WorkerProcess, eventually, make_settings
from tests.gateway_support import api_keys_setting, bearer, serve
from tests.otlp_receiver import ReceivedSpan, otel_env, otlp_receiver

WAIT = 180
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def _all_of(expected: Counter[str]):  # type: ignore[no-untyped-def]
    """Every expected span has arrived (each worker's batch processor exports on its own schedule)."""

    def arrived(spans: list[ReceivedSpan]) -> bool:
        return not expected - Counter(s.name for s in spans)

    return arrived


FLAKY_SPANS = Counter(
    {"invoke_agent otel_t.flaky": 1, "step 0": 1, "step 1": 1, "chat primary": 2, "chat backup": 2,
     "execute_tool otel_write": 1, "wait approval": 1}
)  # fmt: skip
HELD_SPANS = Counter(
    {"invoke_agent otel_t.held": 1, "step 0": 1, "step 1": 1, "step 2": 1, "chat scripted": 3,
     "execute_tool otel_quick": 1, "execute_tool otel_hold": 1}
)  # fmt: skip


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def test_one_trace_for_a_turn_that_retries_fails_over_waits_for_approval_and_runs_a_tool(prefix: str) -> None:
    from stepq.producer.client import Client

    settings = make_settings(prefix, retry_max_attempts=2, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)
    with otlp_receiver() as receiver:
        workers = [WorkerProcess(settings, f"o{i}", env=otel_env(receiver)) for i in (1, 2)]
        try:
            with serve(settings) as served, httpx.Client(base_url=served.url, timeout=30) as http:
                response = http.post(
                    "/v1/turns",
                    json={"agent": "otel_t.flaky", "prompt": "write x"},
                    headers={**bearer("k-acme-all"), "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
                )
                assert response.status_code == 201, response.text
                turn_id = response.json()["turn_id"]
            client = Client(settings)
            request = next(e for e in client.events(turn_id, idle_timeout=WAIT) if e.type == EventType.APPROVAL_REQUEST)
            assert client.approve(request.data["approval_id"], True, reviewer="ops").wait(timeout=60)
            result = client.wait(turn_id, timeout=WAIT)
            assert result.status == TurnStatus.COMPLETED and result.text == "written", result.error
            spans = receiver.wait_for(_all_of(FLAKY_SPANS), timeout=WAIT)
        finally:
            for w in workers:
                w.stop()

    spans = [s for s in spans if s.trace_id == CALLER_TRACE]
    assert {s.trace_id for s in receiver.spans} == {CALLER_TRACE}  # one trace: the caller's
    assert all(s.resource["service.name"] == "stepq-test-worker" for s in spans)
    assert all(s.resource["deployment.environment"] == "test" for s in spans)
    assert Counter(s.name for s in spans) == FLAKY_SPANS  # one of each: nothing emitted twice
    [turn] = [s for s in spans if s.name.startswith("invoke_agent")]
    assert turn.parent_id == CALLER_SPAN  # the gateway request's traceparent is the turn's parent
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.id"] == "otel_t.flaky"
    assert turn.attributes["gen_ai.conversation.id"] == turn_id
    assert turn.attributes["stepq.turn.status"] == "completed"
    assert turn.attributes["stepq.tenant"] == "acme"
    assert turn.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens == 11 + 12
    assert turn.attributes["gen_ai.usage.output_tokens"] == result.usage.output_tokens == 6
    steps = _children(spans, turn)
    assert [s.name for s in steps] == ["step 0", "step 1"]
    assert not any(s.attributes["stepq.step.rerun"] for s in steps)

    first = _children(spans, steps[0])
    assert [s.name for s in first] == ["chat primary", "chat primary", "chat backup", "wait approval",
                                       "execute_tool otel_write"]  # fmt: skip
    retried, failed_over, answered = first[:3]
    assert retried.attributes["error.type"] == "429" and [e[0] for e in retried.events] == ["retry"]
    assert failed_over.attributes["error.type"] == "503" and [e[0] for e in failed_over.events] == ["failover"]
    assert retried.status_code == failed_over.status_code == 2  # STATUS_CODE_ERROR
    for chat in first[:3]:
        assert chat.attributes["gen_ai.operation.name"] == "chat" and chat.kind == 3  # SPAN_KIND_CLIENT
        assert chat.attributes["gen_ai.provider.name"] == "otel-flaky"
    assert [c.attributes["stepq.attempt"] for c in first[:3]] == [0, 1, 0]
    assert answered.attributes["gen_ai.request.model"] == answered.attributes["gen_ai.response.model"] == "backup"
    assert answered.attributes["gen_ai.usage.input_tokens"] == 11
    assert answered.attributes["gen_ai.usage.output_tokens"] == 3
    assert answered.attributes["gen_ai.usage.cache_read.input_tokens"] == 2
    assert answered.attributes["gen_ai.response.finish_reasons"] == ["tool-calls"]
    assert "error.type" not in answered.attributes
    assert "gen_ai.output.messages" not in answered.attributes  # content only when asked for
    wait, tool = first[3:]
    assert wait.end_ns <= tool.start_ns  # the tool ran once the approval came
    assert tool.attributes["gen_ai.tool.name"] == "otel_write"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_write"
    assert tool.attributes["stepq.tool.status"] == "ok" and tool.attributes["stepq.tool.ran"] is True
    trace = result.trace.steps[0]  # `stepq show --trace` and the spans agree
    assert [(a.model, a.outcome, a.error) for a in trace.attempts] == [
        ("primary", "retry", "429"), ("primary", "failover", "503"), ("backup", "ok", None)
    ]  # fmt: skip
    assert abs((tool.end_ns - tool.start_ns) / 1e9 - (trace.calls[0].duration_s or -1)) < 1e-5
    table = trace_table(result.trace)  # `stepq show --trace`: the same attempts, tool time and wait
    assert table[2].startswith("  ↳ attempt 0 on otel-flaky/primary failed (429) → retry, ")
    assert table[3].startswith("  ↳ attempt 1 on otel-flaky/primary failed (503) → failover, ")
    assert table[4] == f"  ↳ tool otel_write (call_write): ok in {trace.calls[0].duration_s:.3f}s"
    assert table[5].startswith("  ↳ waited ") and table[5].endswith("s for approval")
    [second] = _children(spans, steps[1])
    assert second.name == "chat backup" and second.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert turn.start_ns <= steps[0].start_ns and steps[1].end_ns <= turn.end_ns


def test_a_worker_killed_mid_step_leaves_one_trace_with_the_rerun_marked_and_hooks_fire_once(prefix: str) -> None:
    from stepq.producer.client import Client

    settings = make_settings(prefix)
    with otlp_receiver() as receiver, redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        workers = [WorkerProcess(settings, f"k{i}", env=otel_env(receiver)) for i in (1, 2)]
        try:
            client = Client(settings)
            handle = client.submit("otel_t.held", prompt="go", metadata={"prefix": prefix})
            runs = held_runs_key(prefix, handle.turn_id)
            eventually(lambda: r.llen(runs) == 1, timeout=WAIT, what="the held tool's first run")
            # step 0 committed before step 1 began: its spans reach the receiver before we kill anything
            receiver.wait_for(lambda spans: any(s.name == "step 0" for s in spans), timeout=WAIT)
            victim = next(w for w in workers if w.proc.pid == int(r.lindex(runs, 0) or 0))
            victim.kill()  # SIGKILL to its process group, in the middle of step 1
            result = handle.wait(timeout=WAIT)
            assert result.status == TurnStatus.COMPLETED and result.text == "done", result.error
            spans = receiver.wait_for(_all_of(HELD_SPANS), timeout=WAIT)
            hooks = [json.loads(h) for h in r.lrange(hooks_key(prefix), 0, -1)]
        finally:
            for w in workers:
                w.stop()

    assert len({s.trace_id for s in spans}) == 1  # one trace, derived from the turn id (no traceparent)
    assert Counter(s.name for s in spans) == HELD_SPANS  # one of each: no second copy of any step
    by_name = {s.name: s for s in spans}
    assert by_name["step 1"].attributes["stepq.step.rerun"] is True
    assert by_name["step 0"].attributes["stepq.step.rerun"] is False
    assert by_name["step 2"].attributes["stepq.step.rerun"] is False
    assert result.trace.steps[1].rerun  # `stepq show --trace` says so too
    turn = by_name["invoke_agent otel_t.held"]
    assert {by_name[f"step {n}"].parent_id for n in range(3)} == {turn.span_id}
    assert turn.parent_id == ""  # a root: no traceparent was stored

    finished = [h["step"] for h in hooks if h["hook"] == "on_step_finish"]
    assert finished == [0, 1, 2]  # once per committed step: the killed run of step 1 never reached its commit
    assert [h["call"] for h in hooks if h["hook"] == "on_tool_result"] == ["call_q", "call_h"]
    assert [h["status"] for h in hooks if h["hook"] == "on_turn_finish"] == ["completed"]
    starts = [(h["step"], h["rerun"]) for h in hooks if h["hook"] == "on_step_start"]
    assert starts == [(0, False), (1, False), (1, True), (2, False)]  # a start fires per delivery, re-run marked
