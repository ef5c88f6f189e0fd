"""A chat message that closes because its turn parked carries what the person must answer, even when the
gateway sees the parked turn before the worker has published the step's approval request (the worker
publishes just after its parking commit; on a loaded machine the gap is long enough to be seen)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from celery.contrib.testing.worker import start_worker

from stepq.engine.emitter import StepEmitter
from stepq.fleet.protocol import worker_queues
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType
from tests.chat_support import API_KEY, chat_settings, ui_chunks
from tests.conftest import eventually
from tests.gateway_support import serve

TIMEOUT = 120.0


@pytest.fixture
def held_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(release, published): approval requests wait for `release` before they go out; `published` is set
    once one has."""
    release, published = threading.Event(), threading.Event()
    original = StepEmitter.publish

    def publish(self: StepEmitter, type_: EventType, data: dict[str, Any]) -> None:
        if type_ is EventType.APPROVAL_REQUEST:
            release.wait(TIMEOUT)
            original(self, type_, data)
            published.set()
        else:
            original(self, type_, data)

    monkeypatch.setattr(StepEmitter, "publish", publish)
    yield release, published
    release.set()  # never leave a worker thread waiting


def test_a_parked_message_carries_its_approval_request_before_the_worker_publishes_it(
    prefix: str, held_requests: tuple[threading.Event, threading.Event]
) -> None:
    from stepq.workers.app import create_app

    release, published = held_requests
    settings = chat_settings(prefix)
    rt = get_runtime(settings)
    app = create_app(settings)
    worker = start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING", queues=worker_queues(settings)
    )
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with worker, serve(settings) as served, httpx.Client(base_url=served.url, headers=headers, timeout=TIMEOUT) as http:
        question = {"id": f"u-{uuid.uuid4().hex[:6]}", "role": "user", "parts": [{"type": "text", "text": "record"}]}
        body = {"id": "held", "messages": [question], "trigger": "submit-message"}
        with http.stream("POST", "/v1/chat?agent=chat.gated", json=body) as response:
            assert response.status_code == 200, response.read()
            chunks = ui_chunks(response)
        assert not published.is_set()  # the message closed while the request was still held by the worker

        turn_id = chunks[0]["messageId"]
        state = rt.turns.load(turn_id)
        assert state is not None and state.parked is not None
        [pending] = state.parked.approvals
        [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
        assert (request["approvalId"], request["toolCallId"]) == (pending.approval_id, pending.tool_call_id)
        assert chunks[-1]["type"] == "finish"
        assert chunks[-1]["messageMetadata"]["status"] == "awaiting_approval"

        release.set()  # the late request goes out; the person's answer then continues the turn
        assert published.wait(TIMEOUT)
        answer = {
            "id": turn_id,
            "role": "assistant",
            "parts": [
                {
                    "type": "tool-chat_record",
                    "toolCallId": request["toolCallId"],
                    "state": "approval-responded",
                    "approval": {"id": request["approvalId"], "approved": True},
                }
            ],
        }
        body = {"id": "held", "messages": [question, answer], "trigger": "submit-message"}
        with http.stream("POST", "/v1/chat?agent=chat.gated", json=body) as response:
            assert response.status_code == 200, response.read()
            rest = ui_chunks(response)
        assert [c["type"] for c in rest].count("tool-approval-request") == 0
        assert "That is settled." in "".join(c.get("delta", "") for c in rest if c["type"] == "text-delta")
        eventually(lambda: (s := rt.turns.load(turn_id)) is not None and s.status.terminal, TIMEOUT, "turn finished")
