"""Client-side tools through POST /v1/chat (real uvicorn, a worker process, real Redis): the message closes
parked on the browser's tools, and the assistant message carrying their outputs (addToolOutput) resumes it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.chat_support import ChatStack, chat_stack, ui_chunks
from tests.test_chat_gateway import ask, http, post, question


@pytest.fixture
def stack(prefix: str) -> Iterator[ChatStack]:
    with chat_stack(prefix) as running:
        yield running


def _answer(turn_id: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": turn_id, "role": "assistant", "parts": parts}


def test_browser_tools_park_the_message_and_their_outputs_resume_it(stack: ChatStack) -> None:
    with http(stack) as client:
        q = question("plan it")
        parked = ask(client, "browser", [q], "ct.browser")
        turn_id = parked[0]["messageId"]
        assert parked[-1]["type"] == "finish"
        assert parked[-1]["messageMetadata"]["status"] == "awaiting_tool_results"
        available = {c["toolCallId"] for c in parked if c["type"] == "tool-input-available"}
        outputs = {c["toolCallId"] for c in parked if c["type"] == "tool-output-available"}
        assert available == {"call_0_0", "call_0_1", "call_0_2"} and outputs == {"call_0_0"}  # the server's ran

        server_part = {"type": "tool-ct_echo", "toolCallId": "call_0_0", "state": "output-available", "output": {}}
        pick = {"type": "tool-ct_pick_date", "toolCallId": "call_0_1", "state": "output-available", "output": "fri"}
        geo = {"type": "tool-ct_geolocate", "toolCallId": "call_0_2", "state": "output-error", "errorText": "denied"}
        partial = post(client, "browser", [q, _answer(turn_id, [server_part, pick])])
        assert partial.status_code == 422 and partial.json()["error"]["code"] == "missing-results"
        assert "'call_0_2'" in partial.json()["error"]["message"]

        body = {"id": "browser", "messages": [q, _answer(turn_id, [server_part, pick, geo])]}
        with client.stream("POST", "/v1/chat", json=body) as response:
            assert response.status_code == 200
            done = ui_chunks(response)
        assert done[0]["messageId"] == turn_id
        tools = [(c["type"], c["toolCallId"]) for c in done if c["type"].startswith("tool-output")]
        assert tools == [("tool-output-available", "call_0_1"), ("tool-output-error", "call_0_2")]
        text = "".join(c["delta"] for c in done if c["type"] == "text-delta")
        assert 'ct_pick_date="fri",ct_geolocate={"error": "denied", "status": "failed"}' in text
        assert done[-1]["messageMetadata"]["status"] == "completed"

        # sent again (a client retry): the outputs are already in, so nothing new is supplied
        again = post(client, "browser", [q, _answer(turn_id, [server_part, pick, geo])])
        assert again.status_code == 422
