"""The quickest look at the traces: `stepq run` (embedded, one process) with OTEL_TRACES_EXPORTER=console
prints the turn's spans, one trace, with the GenAI attributes; message content only when asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

TIMEOUT = 120


def _stepq_run(agent: str = "otel_t.hooked", **extra_env: str) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("STEPQ_") or k.startswith("OTEL_"))}
    env.update(PYTHONPATH=str(ROOT), STEPQ_AGENT_MODULES="tests.agents_otel", OTEL_TRACES_EXPORTER="console")
    env.update(extra_env)
    script = Path(sys.executable).with_name("stepq")
    proc = subprocess.run(
        [str(script), "run", agent, "go"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return _spans(proc.stdout)


def _spans(text: str) -> list[dict[str, Any]]:
    """The console exporter's JSON objects, out of the run's other output."""
    decoder, spans, at = json.JSONDecoder(), [], text.find('{\n    "name"')
    while at != -1:
        span, end = decoder.raw_decode(text, at)
        spans.append(span)
        at = text.find('{\n    "name"', end)
    return spans


def test_stepq_run_with_the_console_exporter_prints_the_turns_spans():
    spans = _stepq_run(OTEL_SERVICE_NAME="quick-look")
    names = sorted(s["name"] for s in spans)
    assert names == sorted(
        ["invoke_agent otel_t.hooked", "step 0", "step 1", "chat scripted", "chat scripted", "execute_tool otel_quick"]
    )
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    assert all(s["resource"]["attributes"]["service.name"] == "quick-look" for s in spans)
    chats = [s for s in spans if s["name"] == "chat scripted"]
    assert all(c["attributes"]["gen_ai.operation.name"] == "chat" for c in chats)
    assert all("gen_ai.output.messages" not in c["attributes"] for c in chats)


def test_message_content_is_recorded_only_when_asked_for_and_never_a_secret():
    secret = "sk-ant-otel-test-7Hq2"
    spans = _stepq_run(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true", ANTHROPIC_API_KEY=secret)
    [first, _] = sorted((s for s in spans if s["name"] == "chat scripted"), key=lambda s: s["start_time"])
    [output] = json.loads(first["attributes"]["gen_ai.output.messages"])
    assert output["parts"][0] == {"type": "text", "content": "looking"}
    [tool] = [s for s in spans if s["name"] == "execute_tool otel_quick"]
    assert json.loads(tool["attributes"]["gen_ai.tool.call.result"]) == {"key": "b", "value": "B"}

    spans = _stepq_run(
        "otel_t.leaky", OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true", ANTHROPIC_API_KEY=secret
    )
    [tool] = [s for s in spans if s["name"] == "execute_tool otel_secret"]
    assert json.loads(tool["attributes"]["gen_ai.tool.call.result"]) == {"token": "***"}  # masked
    assert secret not in json.dumps(spans)
