"""The chat routes' own rules over real HTTP (uvicorn, a worker process, real Redis): chats per tenant,
approvals only as a principal who may approve, clear errors for what the protocol cannot do, history."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.chat_support import API_KEY, OTHER_TENANT_KEY, SUBMIT_ONLY_KEY, ChatStack, chat_stack, ui_chunks

TIMEOUT = 60.0


@pytest.fixture
def stack(prefix: str) -> Iterator[ChatStack]:
    with chat_stack(prefix) as running:
        yield running


def http(stack: ChatStack, key: str = API_KEY) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)


def question(text: str) -> dict[str, Any]:
    return {"id": f"u-{uuid.uuid4().hex[:6]}", "role": "user", "parts": [{"type": "text", "text": text}]}


def post(
    client: httpx.Client, chat_id: str, messages: list[dict[str, Any]], agent: str | None = None
) -> httpx.Response:
    url = f"/v1/chat?agent={agent}" if agent else "/v1/chat"
    return client.post(url, json={"id": chat_id, "messages": messages, "trigger": "submit-message"})


def ask(client: httpx.Client, chat_id: str, messages: list[dict[str, Any]], agent: str) -> list[dict[str, Any]]:
    url = f"/v1/chat?agent={agent}"
    with client.stream("POST", url, json={"id": chat_id, "messages": messages, "trigger": "submit-message"}) as r:
        assert r.status_code == 200, r.read()
        return ui_chunks(r)


def approval_answer(chunks: list[dict[str, Any]], approved: bool) -> dict[str, Any]:
    [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
    return {
        "id": chunks[0]["messageId"],
        "role": "assistant",
        "parts": [
            {
                "type": "tool-chat_record",
                "toolCallId": request["toolCallId"],
                "state": "approval-responded",
                "approval": {"id": request["approvalId"], "approved": approved},
            }
        ],
    }


def test_chat_ids_are_per_tenant(stack: ChatStack) -> None:
    with http(stack) as mine, http(stack, OTHER_TENANT_KEY) as theirs:
        first = ask(mine, "same-id", [question("hello")], "chat.plain")
        other = ask(theirs, "same-id", [question("hi")], "chat.tools")
        assert first[0]["messageMetadata"]["threadId"] != other[0]["messageMetadata"]["threadId"]
        history = theirs.get("/v1/chat/same-id/messages").json()
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
        assert history["messages"][0]["parts"][0]["text"] == "hi"
        assert history["agent"] == "chat.tools"
        assert [m["parts"][0]["text"] for m in mine.get("/v1/chat/same-id/messages").json()["messages"][:1]] == [
            "hello"
        ]
        assert theirs.get(f"/v1/turns/{first[0]['messageId']}").status_code == 404


def test_approvals_need_the_tenant_and_the_approve_scope(stack: ChatStack) -> None:
    with http(stack) as mine, http(stack, SUBMIT_ONLY_KEY) as bot, http(stack, OTHER_TENANT_KEY) as theirs:
        q = question("please record this")
        parked = ask(mine, "gated", [q], "chat.gated")
        assert parked[-1]["messageMetadata"]["status"] == "awaiting_approval"
        turn_id = parked[0]["messageId"]
        answer = approval_answer(parked, approved=True)

        refused = post(bot, "gated", [q, answer])
        assert refused.status_code == 403
        assert "approve" in refused.json()["error"]["message"]
        foreign = post(theirs, "gated", [q, answer])
        assert foreign.status_code == 404
        assert mine.get(f"/v1/turns/{turn_id}").json()["status"] == "awaiting_approval"

        with mine.stream("POST", "/v1/chat", json={"id": "gated", "messages": [q, answer]}) as response:
            done = ui_chunks(response)
        assert done[0] == {"type": "start", "messageId": turn_id, "messageMetadata": parked[0]["messageMetadata"]}
        assert [c["type"] for c in done if c["type"].startswith("tool-")] == [
            "tool-approval-response",
            "tool-output-available",
        ]
        assert done[-1]["messageMetadata"]["status"] == "completed"
        # the same answer sent again (a client retry) is not an error: the approval is already decided
        with mine.stream("POST", "/v1/chat", json={"id": "gated", "messages": [q, answer]}) as response:
            assert response.status_code == 200
            again = ui_chunks(response)
        assert again[-1]["type"] == "finish"


def test_requests_the_protocol_cannot_serve_get_clear_errors(stack: ChatStack) -> None:
    with http(stack) as client:
        none = post(client, "no-agent", [question("hi")])
        assert none.status_code == 422 and "?agent=" in none.json()["error"]["message"]
        regen = client.post(
            "/v1/chat?agent=chat.plain", json={"id": "r", "messages": [question("x")], "trigger": "regenerate-message"}
        )
        assert regen.status_code == 422 and "regenerat" in regen.json()["error"]["message"]
        assert post(client, "empty", [], "chat.plain").status_code == 422
        blank = post(
            client, "blank", [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "  "}]}], "chat.plain"
        )
        assert blank.status_code == 422
        unknown = post(client, "unknown", [question("hi")], "no.such_agent")
        assert unknown.status_code == 400 and "no.such_agent" in unknown.json()["error"]["message"]

        q = question("two parts please")
        with client.stream("POST", "/v1/chat?agent=chat.gate", json={"id": "busy", "messages": [q]}) as running:
            assert running.status_code == 200
            lines = running.iter_lines()
            start = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
            busy = post(client, "busy", [q, question("are you there?")], "chat.gate")
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "chat-busy"
            mismatch = post(client, "busy", [question("hi")], "chat.plain")
            assert mismatch.status_code == 409 and mismatch.json()["error"]["code"] == "agent-mismatch"
            with client.stream("GET", "/v1/chat/busy/stream") as resumed:  # the turn is live: it replays
                assert resumed.status_code == 200
                head = json.loads(next(line for line in resumed.iter_lines() if line.startswith("data: "))[6:])
                assert head["messageId"] == start["messageId"]
            assert httpx.post(f"{stack.control_url}/release/{start['messageId']}").status_code == 200
            assert any(line == "data: [DONE]" for line in lines)
        assert client.get(f"/v1/chat/{uuid.uuid4().hex}/stream").status_code == 204


def test_history_lists_finished_turns_as_ui_messages(stack: ChatStack) -> None:
    with http(stack) as client:
        first_q, second_q = question("what is alpha?"), question("and again?")
        first = ask(client, "history", [first_q], "chat.tools")
        second = ask(
            client,
            "history",
            [first_q, {"id": first[0]["messageId"], "role": "assistant", "parts": []}, second_q],
            "chat.tools",
        )
        body = client.get("/v1/chat/history/messages").json()
        assert body["active"] is False
        messages = body["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        assert [m["id"] for m in messages if m["role"] == "assistant"] == [
            first[0]["messageId"],
            second[0]["messageId"],
        ]
        assert messages[2]["parts"] == [{"type": "text", "text": "and again?"}]
        tool = next(p for p in messages[1]["parts"] if p["type"] == "tool-chat_lookup")
        assert tool["state"] == "output-available"
        assert tool["input"] == {"key": "alpha"}
        assert tool["output"] == {"key": "alpha", "value": "the first letter"}
        texts = [p["text"] for p in messages[3]["parts"] if p["type"] == "text"]
        assert texts == ["Looking it up.", "Alpha is the first letter."]


def test_answering_one_of_two_approvals_closes_the_message_until_the_other_is_answered(stack: ChatStack) -> None:
    with http(stack) as client:
        q = question("record both")
        parked = ask(client, "two", [q], "chat.gated_two")
        requests = [c for c in parked if c["type"] == "tool-approval-request"]
        assert len(requests) == 2 and parked[-1]["messageMetadata"]["status"] == "awaiting_approval"

        def answer(*approved: bool) -> dict[str, Any]:
            parts = [
                {
                    "type": "tool-chat_record",
                    "toolCallId": r["toolCallId"],
                    "state": "approval-responded",
                    "approval": {"id": r["approvalId"], "approved": ok},
                }
                for r, ok in zip(requests, approved, strict=False)
            ]
            return {"id": parked[0]["messageId"], "role": "assistant", "parts": parts}

        with client.stream("POST", "/v1/chat", json={"id": "two", "messages": [q, answer(True)]}) as response:
            half = ui_chunks(response)  # one answered: the step still waits for the other
        assert [c["type"] for c in half if c["type"].startswith("tool-")] == ["tool-approval-response"]
        assert half[-1]["messageMetadata"]["status"] == "awaiting_approval"

        with client.stream("POST", "/v1/chat", json={"id": "two", "messages": [q, answer(True, False)]}) as response:
            done = ui_chunks(response)
        outcomes = {c["toolCallId"]: c["type"] for c in done if c["type"].startswith("tool-output")}
        assert outcomes == {
            requests[0]["toolCallId"]: "tool-output-available",
            requests[1]["toolCallId"]: "tool-output-denied",
        }
        assert done[-1]["messageMetadata"]["status"] == "completed"
