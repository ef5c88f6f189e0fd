"""Files to the OpenAI providers: the unmodified `openai` SDK against the fake OpenAI API, through full turns
(submit -> in-process worker on real Redis -> the request body the fake received). The Responses API takes
`input_image` / `input_file` with base64 data URLs; Chat Completions takes `image_url`, PDF `file` parts
(where the server accepts them) and a text file's contents as text."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from stepq import Attachment, Client
from stepq.errors import SubmitError
from stepq.models import FilePart, TurnStatus, UserMessage
from stepq.providers.base import ProviderError, StepRequest
from stepq.providers.openai.wire import chat_params
from tests.conftest import REDIS_URL
from tests.fakes.openai_server import FakeOpenAI, chat_text, response_text

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(64)
PDF = b"%PDF-1.4\n" + os.urandom(256) + b"\n%%EOF"
TEXT = "Invoice 42: 3 x widgets, total €12.\n".encode()
WAIT = 120.0  # generous: the machine is shared and busy
FILES = [
    Attachment.from_bytes(PNG, "image/png"),
    Attachment.from_bytes(PDF, "application/pdf", name="invoice.pdf"),
    Attachment.from_bytes(TEXT, "text/plain", name="notes.txt"),
]


def url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-files-test")
    monkeypatch.setenv("STEPQ_OPENAI_COMPATIBLE_BASE_URL", server.base_url + "/v1")
    for name in ("OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "STEPQ_OPENAI_COMPATIBLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.stop()


def completed(handle: Any) -> Any:
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED, result.error
    return result


def test_responses_api_gets_input_image_and_input_file_data_urls(worker, client, fake):
    fake.enqueue(response_text("a widget invoice"))
    handle = client.submit("openai_t.files", prompt="What is this?", attachments=FILES)
    assert completed(handle).text == "a widget invoice"

    [request] = fake.wait_for_requests(1)
    assert request.path == "/v1/responses"
    assert request.body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": url("image/png", PNG), "detail": "auto"},
                {"type": "input_file", "filename": "invoice.pdf", "file_data": url("application/pdf", PDF)},
                {"type": "input_file", "filename": "notes.txt", "file_data": url("text/plain", TEXT)},
                {"type": "input_text", "text": "What is this?"},
            ],
        }
    ]


def test_chat_completions_gets_image_url_file_and_text_parts(worker, client, fake):
    fake.enqueue(chat_text("read ", "them"))
    handle = client.submit("openai_t.compat_files", prompt="Summarize.", attachments=FILES)
    assert completed(handle).text == "read them"

    [request] = fake.wait_for_requests(1)
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url("image/png", PNG)}},
                {"type": "file", "file": {"filename": "invoice.pdf", "file_data": url("application/pdf", PDF)}},
                {"type": "text", "text": "notes.txt:\n" + TEXT.decode()},
                {"type": "text", "text": "Summarize."},
            ],
        }
    ]


def test_azure_openai_takes_pdf_file_parts_on_the_deployment_route(worker, client, fake, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", fake.base_url)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key-0123456789")
    monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
    monkeypatch.delenv("AZURE_OPENAI_AD_TOKEN", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL")
    fake.enqueue(chat_text("azure read it"))
    handle = client.submit(
        "openai_t.azure_files", prompt="Total?", attachments=[Attachment.from_bytes(PDF, "application/pdf")]
    )
    assert completed(handle).text == "azure read it"

    [request] = fake.wait_for_requests(1)
    assert request.path.startswith("/openai/deployments/my-deployment/chat/completions")
    [part, _] = request.body["messages"][0]["content"]
    assert part == {"type": "file", "file": {"filename": "document.pdf", "file_data": url("application/pdf", PDF)}}


def test_a_pdf_for_a_compatible_server_without_file_parts_is_refused_at_submit_storing_nothing(client, prefix, fake):
    keys = redis.Redis.from_url(REDIS_URL)
    before = set(keys.scan_iter(match=f"{prefix}:*", count=1000))
    with pytest.raises(SubmitError, match=r"'invoice\.pdf' is application/pdf, which agent openai_t\.compat_no_pdf "
                                          r"cannot send to its OpenAI-compatible server .* file_parts=true"):  # fmt: skip
        client.submit("openai_t.compat_no_pdf", prompt="hi", attachments=FILES)
    assert set(keys.scan_iter(match=f"{prefix}:*", count=1000)) == before
    assert fake.requests == []
    keys.close()


def test_images_still_reach_a_compatible_server_without_file_parts(worker, client: Client, fake):
    fake.enqueue(chat_text("a picture"))
    handle = client.submit("openai_t.compat_no_pdf", prompt="See?", attachments=FILES[:1])
    assert completed(handle).text == "a picture"
    [request] = fake.wait_for_requests(1)
    assert request.body["messages"][0]["content"][0] == {
        "type": "image_url",
        "image_url": {"url": url("image/png", PNG)},
    }


def test_a_pdf_reaching_a_compatible_server_after_failover_is_one_fatal_line():
    """Submit checks the agent's own provider; a fallback to a server without PDF parts refuses at the call."""
    pdf = FilePart(media_type="application/pdf", data=base64.b64encode(PDF).decode(), name="invoice.pdf")
    request = StepRequest(
        provider="openai-compatible", model="m", messages=[UserMessage(content="hi", files=[pdf])], options={}
    )
    with pytest.raises(ProviderError, match="openai-compatible cannot take application/pdf files") as info:
        chat_params(request)
    assert info.value.retryable is False and "\n" not in info.value.message
