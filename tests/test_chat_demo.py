"""`stepq demo --serve`: gateway + worker + the in-process Redis stand-in in one process, offline, serving
the chat page and the chat protocol on the demo agents (no STEPQ_REDIS_URL, no credentials)."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.chat_support import ui_chunks
from tests.conftest import ROOT

TIMEOUT = 60.0


@pytest.fixture
def demo_url() -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepq.producer.cli", "demo", "--serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or []], daemon=True).start()
    try:
        seen = []
        while True:
            line = lines.get(timeout=TIMEOUT)
            seen.append(line)
            found = re.search(r"(http://127\.0\.0\.1:\d+)/\?agent=demo\.support", line)
            if found:
                yield found.group(1)
                break
            assert proc.poll() is None, "".join(seen)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_demo_serve_chats_offline_with_an_approval(demo_url: str) -> None:
    with httpx.Client(base_url=demo_url, timeout=TIMEOUT) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert '<script type="module" src="/ui/chat.js">' in page.text
        assert "readUIMessageStream" not in page.text and http.get("/ui/chat.js").status_code == 200

        question = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "My grinder arrived broken."}]}
        body = {"id": "demo-chat", "messages": [question], "trigger": "submit-message"}
        with http.stream("POST", "/v1/chat", json=body) as response:
            assert response.status_code == 200, response.read()
            first = ui_chunks(response)
        assert first[-1]["messageMetadata"]["status"] == "awaiting_approval"
        [request] = [c for c in first if c["type"] == "tool-approval-request"]
        refund = next(
            c for c in first if c["type"] == "tool-input-available" and c["toolCallId"] == request["toolCallId"]
        )
        assert refund["toolName"] == "issue_refund"
        assert "token" not in json.dumps(first)

        answer = {
            "id": first[0]["messageId"],
            "role": "assistant",
            "parts": [
                {
                    "type": "tool-issue_refund",
                    "toolCallId": request["toolCallId"],
                    "state": "approval-responded",
                    "input": refund["input"],
                    "approval": {"id": request["approvalId"], "approved": True},
                }
            ],
        }
        body = {"id": "demo-chat", "messages": [question, answer], "trigger": "submit-message"}
        with http.stream("POST", "/v1/chat", json=body) as response:
            assert response.status_code == 200, response.read()
            second = ui_chunks(response)
        [output] = [c for c in second if c["type"] == "tool-output-available"]
        assert output["output"]["order_id"] == "A-1001" and output["output"]["refund_id"].startswith("R-")
        text = "".join(c["delta"] for c in second if c["type"] == "text-delta")
        assert text == "Done: the refund is on its way. Anything else I can help with?"
        assert second[-1]["type"] == "finish" and second[-1]["messageMetadata"]["status"] == "completed"
