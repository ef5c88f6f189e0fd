"""The Anthropic SDK traces its own API calls (anthropic 2.x: a span per call through OpenTelemetry's global
tracer provider, and its trace context sent with the request). stepq emits each model call's span itself once
the step commits, so the clients it builds (`anthropic`, `anthropic-vertex`) have the SDK's spans and
propagation off.

Checked with the real SDK against the local fake Messages API, in a subprocess that registers a global tracer
provider (which cannot be unset in the test process): a plain SDK client, the control, records a span and sends
a `traceparent`; stepq's clients record none and send none.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import pytest

from tests.fakes.anthropic_server import FakeAnthropic, text_reply
from tests.test_provider_anthropic import fake, vertex  # noqa: F401 - fixtures: the fake and its Vertex setup

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    "open_telemetry" not in inspect.signature(anthropic.Anthropic.__init__).parameters,
    reason="this anthropic SDK does not trace its own calls",
)

CALLS = """
import json

import anthropic
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stepq.providers.anthropic.adapter import new_client
from stepq.providers.anthropic.vertex import vertex_client

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

spans = {}
for name, client in (("control", anthropic.Anthropic(max_retries=0)), ("stepq", new_client()), ("vertex", vertex_client())):
    before = len(exporter.get_finished_spans())
    with client.messages.create(
        model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
    ) as events:
        for _ in events:
            pass
    spans[name] = len(exporter.get_finished_spans()) - before
print(json.dumps(spans))
"""


def test_stepqs_clients_record_no_sdk_span_and_send_no_trace_context(vertex: FakeAnthropic) -> None:  # noqa: F811
    for _ in range(3):
        vertex.enqueue(text_reply("ok"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CALLS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    calls = [r for r in vertex.requests if r.path != "/token"]
    assert len(calls) == 3, [r.path for r in vertex.requests]
    traceparent = {
        name: "traceparent" in r.headers for name, r in zip(("control", "stepq", "vertex"), calls, strict=True)
    }
    # the control shows the SDK does trace here, so the absence below is stepq's doing
    assert spans["control"] >= 1 and traceparent["control"]
    assert spans == {"control": spans["control"], "stepq": 0, "vertex": 0}
    assert traceparent == {"control": True, "stepq": False, "vertex": False}
