"""Attachments end to end: submit (checks, storage), an in-process worker on real Redis, and the unmodified
provider SDKs against the wire fakes, whose recorded request bodies show the native blocks."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis
from celery.contrib.testing.worker import start_worker

from stepq import Attachment, Client
from stepq.config.settings import Settings
from stepq.errors import SubmitError
from stepq.fleet.protocol import worker_queues
from stepq.fleet.runtime import Runtime
from stepq.models import TurnStatus
from stepq.store.keys import Keys
from stepq.workers.app import create_app
from tests.chat_support import API_KEY, chat_stack, ui_chunks
from tests.conftest import REDIS_URL, make_settings
from tests.fakes import anthropic_server as a
from tests.fakes import bedrock_server as b
from tests.fakes import gemini_server as g
from tests.test_provider_bedrock import _isolate_aws
from tests.test_provider_gemini import _clear_env

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(64)
PDF = b"%PDF-1.4\n" + os.urandom(256) + b"\n%%EOF"
TEXT = "Invoice 42: 3 x widgets, total €12.\n".encode()
WAIT = 120.0  # generous: the machine is shared and busy


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class _Files(BaseHTTPRequestHandler):
    """Serves PNG at any path (the test's allowlist decides which paths a worker may fetch)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "image/png")
        self.send_header("content-length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)


@pytest.fixture
def files_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def settings(prefix: str, files_url: str) -> Settings:
    return make_settings(prefix, attachment_url_allow=[f"{files_url}/files/"])


@pytest.fixture
def anthropic_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[a.FakeAnthropic]:
    server = a.FakeAnthropic().start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-anthropic-key")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield server
    server.stop()


def prefix_keys(prefix: str) -> set[str]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        return set(client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


def completed(handle: Any) -> Any:
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED, result.error
    return result


# --------------------------------------------------------------------------- providers


def test_anthropic_gets_image_and_document_blocks(worker, client, anthropic_fake):
    anthropic_fake.enqueue(a.text_reply("a widget invoice"))
    handle = client.submit(
        "attach_t.anthropic",
        prompt="What is this?",
        attachments=[
            Attachment.from_bytes(PNG, "image/png"),
            Attachment.from_bytes(PDF, "application/pdf", name="invoice.pdf"),
            Attachment.from_bytes(TEXT, "text/plain", name="notes.txt"),
        ],
    )
    assert completed(handle).text == "a widget invoice"

    (request,) = anthropic_fake.requests
    (message,) = request.body["messages"]
    assert message["role"] == "user"
    assert message["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
            "title": "invoice.pdf",
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": TEXT.decode()},
            "title": "notes.txt",
        },
        {"type": "text", "text": "What is this?", "cache_control": {"type": "ephemeral"}},
    ]


def test_gemini_gets_inline_data_and_gs_file_data(worker, client, monkeypatch):
    _clear_env(monkeypatch)
    fake = g.FakeGemini().start()
    try:
        monkeypatch.setenv("GOOGLE_API_KEY", "test-gemini-key")
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
        fake.enqueue(g.text_reply("two files"))
        handle = client.submit(
            "attach_t.gemini",
            prompt="Compare",
            attachments=[
                Attachment.from_bytes(PDF, "application/pdf"),
                Attachment.from_url("gs://bucket-t/scans/page.png"),
            ],
        )
        assert completed(handle).text == "two files"
        (request,) = fake.requests
    finally:
        fake.stop()
    (content,) = request.body["contents"]
    inline, file_data, text = content["parts"]
    # the SDK sends inline bytes as URL-safe base64 and the blob's fields in snake case (the API takes both)
    assert inline["inlineData"]["mime_type"] == "application/pdf"
    assert base64.urlsafe_b64decode(inline["inlineData"]["data"]) == PDF
    assert file_data == {"fileData": {"file_uri": "gs://bucket-t/scans/page.png", "mime_type": "image/png"}}
    assert text == {"text": "Compare"}


def test_bedrock_gets_image_and_document_bytes(worker, client, monkeypatch):
    fake = b.FakeBedrock()
    try:
        _isolate_aws(monkeypatch)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", fake.url)
        fake.add(b.turn(b.text_block(0, ["read"])))
        handle = client.submit(
            "attach_t.bedrock",
            prompt="Read these",
            attachments=[
                Attachment.from_bytes(PNG, "image/png"),
                Attachment.from_bytes(PDF, "application/pdf", name="Q3 invoice (final).pdf"),
                Attachment.from_bytes(TEXT, "text/plain"),
            ],
        )
        assert completed(handle).text == "read"
        (request,) = fake.requests
    finally:
        fake.close()
    (message,) = request.body["messages"]
    assert message["content"] == [
        {"image": {"format": "png", "source": {"bytes": b64(PNG)}}},
        {"document": {"format": "pdf", "name": "Q3 invoice (final)", "source": {"bytes": b64(PDF)}}},
        {"document": {"format": "txt", "name": "document 3", "source": {"bytes": b64(TEXT)}}},
        {"text": "Read these"},
    ]


def test_file_parts_in_messages_are_stored_once_and_referenced(worker, client, rt: Runtime, anthropic_fake):
    """A chat-style `content` list with a data: URL; the transcript in Redis keeps only the reference."""
    anthropic_fake.enqueue(a.text_reply("a png"))
    handle = client.submit(
        "attach_t.anthropic",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "file", "media_type": "image/png", "data": f"data:image/png;base64,{b64(PNG)}"},
                ],
            }
        ],
    )
    completed(handle)
    (request,) = anthropic_fake.requests
    assert request.body["messages"][0]["content"][0]["source"]["data"] == b64(PNG)

    stored = rt.redis.lrange(rt.keys.messages(handle.turn_id), 0, -1)
    assert b64(PNG) not in "".join(stored)
    (file_part,) = json.loads(stored[0])["files"]
    assert file_part["data"] is None and file_part["size"] == len(PNG)
    assert rt.redis.hgetall(rt.keys.attachments(handle.turn_id)) == {file_part["attachment_id"]: b64(PNG)}
    assert 0 < rt.redis.ttl(rt.keys.attachments(handle.turn_id)) <= rt.settings.event_ttl_s  # ended with the turn


def test_a_url_on_the_allowlist_is_fetched_by_the_worker(worker, client, rt: Runtime, files_url, anthropic_fake):
    anthropic_fake.enqueue(a.text_reply("fetched"))
    url = f"{files_url}/files/photo.png"
    handle = client.submit("attach_t.anthropic", prompt="Look", attachments=[Attachment.from_url(url)])
    completed(handle)
    (request,) = anthropic_fake.requests
    block = request.body["messages"][0]["content"][0]
    assert block == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    (file_part,) = json.loads(rt.redis.lrange(rt.keys.messages(handle.turn_id), 0, 0)[0])["files"]
    assert file_part["url"] == url and file_part["attachment_id"] is None


# --------------------------------------------------------------------------- refusals store nothing


def _refused(client: Client, prefix: str, match: str, agent: str, **kwargs: Any) -> None:
    before = prefix_keys(prefix)
    with pytest.raises(SubmitError, match=match):
        client.submit(agent, prompt="hi", **kwargs)
    assert prefix_keys(prefix) == before


def test_a_media_type_the_agent_does_not_accept_is_refused_and_nothing_is_stored(client, prefix):
    _refused(
        client,
        prefix,
        r"agent attach_t\.images_only does not accept application/pdf files \(accepted: image/png\)",
        "attach_t.images_only",
        attachments=[Attachment.from_bytes(PNG, "image/png"), Attachment.from_bytes(PDF, "application/pdf")],
    )
    _refused(
        client,
        prefix,
        r"agent attach_t\.text_only does not accept image/png files \(accepted: none\)",
        "attach_t.text_only",
        attachments=[Attachment.from_bytes(PNG, "image/png")],
    )
    _refused(
        client,
        prefix,
        "image/svg\\+xml, which stepq does not carry",
        "attach_t.images_only",
        attachments=[Attachment.from_bytes(b"<svg/>", "image/svg+xml")],
    )


def test_oversize_files_are_refused_and_nothing_is_stored(prefix, tmp_path):
    with Client(make_settings(prefix, attachment_max_bytes=1000, attachment_turn_max_bytes=1500)) as small:
        _refused(
            small,
            prefix,
            r"is 1001 bytes; the limit is 1000 \(STEPQ_ATTACHMENT_MAX_BYTES\)",
            "attach_t.images_only",
            attachments=[Attachment.from_bytes(PNG[:8] + bytes(993), "image/png")],
        )
        big = tmp_path / "big.png"
        big.write_bytes(bytes(1001))
        _refused(
            small, prefix, "big.png is 1001 bytes", "attach_t.images_only", attachments=[Attachment.from_path(big)]
        )
        _refused(
            small,
            prefix,
            r"total 1600 bytes; the limit is 1500 \(STEPQ_ATTACHMENT_TURN_MAX_BYTES\)",
            "attach_t.images_only",
            attachments=[
                Attachment.from_bytes(bytes(800), "image/png"),
                Attachment.from_bytes(b"\x01" * 800, "image/png"),
            ],
        )


def test_urls_off_the_allowlist_and_misplaced_gs_refs_are_refused_at_submit(client, prefix, files_url, anthropic_fake):
    port = int(files_url.rsplit(":", 1)[1])
    for url in (
        f"{files_url}/other/photo.png",  # another path
        f"http://127.0.0.1:{port + 1}/files/photo.png",  # another port
        f"https://127.0.0.1:{port}/files/photo.png",  # another scheme
        "http://127.0.0.1.evil.test/files/photo.png",
        "file:///etc/passwd.png",
        # path traversal out of the allowlisted /files/ folder, plain and percent-encoded (the server decodes it)
        f"{files_url}/files/../other/photo.png",
        f"{files_url}/files/%2e%2e/other/photo.png",
        f"{files_url}/files/%2E%2E%2Fother/photo.png",
        f"{files_url}/files/..%5cother/photo.png",
        f"{files_url}/files/./photo.png",
        f"{files_url}/files-private/photo.png",  # shares the prefix's letters, not its folder
    ):
        _refused(
            client, prefix, "STEPQ_ATTACHMENT_URL_ALLOW", "attach_t.anthropic", attachments=[Attachment.from_url(url)]
        )
    _refused(
        client,
        prefix,
        "a gs:// file reaches only Gemini, and this turn runs on anthropic",
        "attach_t.anthropic",
        attachments=[Attachment.from_url("gs://bucket/x.pdf")],
    )


def test_a_caller_cannot_name_a_stored_attachment(client, prefix):
    """Ids are stepq's: naming one (another turn's file, say) is refused."""
    before = prefix_keys(prefix)
    with pytest.raises(SubmitError, match="has an attachment_id, which stepq assigns"):
        client.submit(
            "attach_t.images_only",
            messages=[
                {"role": "user", "content": [{"type": "file", "media_type": "image/png", "attachment_id": "0" * 64}]}
            ],
        )
    assert prefix_keys(prefix) == before


# --------------------------------------------------------------------------- stored once


def test_a_20_mb_pdf_is_stored_once_for_a_five_step_turn(worker, client, rt: Runtime):
    pdf = b"%PDF-1.7\n" + os.urandom(20 * 2**20)
    handle = client.submit(
        "attach_t.reader", prompt="Read every page", attachments=[Attachment.from_bytes(pdf, "application/pdf")]
    )
    result = completed(handle)
    assert len(result.trace.steps) == 5 and result.text == "read it"

    turn_keys = list(rt.redis.scan_iter(match=f"{rt.keys.turn(handle.turn_id)}*", count=1000))
    used = sum(int(rt.redis.memory_usage(key, samples=0) or 0) for key in turn_keys)
    assert len(pdf) <= used < 2 * len(pdf), (used, len(pdf))


def test_a_later_step_still_sends_the_files_of_the_first_message(worker, client):
    """The worker's process has stored and read the transcript by the third step (it knows whether it carries files
    without asking every message again): the file still reaches the model with its bytes."""
    handle = client.submit("attach_t.rereader", prompt="Look", attachments=[Attachment.from_bytes(PNG, "image/png")])
    result = completed(handle)
    assert len(result.trace.steps) == 3
    assert result.text.startswith(f"saw: user:Look [image/png, {len(PNG)} bytes] | assistant: call:att_note"), (
        result.text
    )


# --------------------------------------------------------------------------- threads


def test_a_thread_keeps_its_files_for_later_turns(worker, client, rt: Runtime, anthropic_fake):
    anthropic_fake.enqueue(a.text_reply("a png"), a.text_reply("still a png"))
    thread = client.create_thread("attach_t.anthropic")
    first = client.continue_thread(
        thread.thread_id, prompt="What is it?", attachments=[Attachment.from_bytes(PNG, "image/png")]
    )
    completed(first)
    second = client.continue_thread(thread.thread_id, prompt="And now?")
    completed(second)

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    first_body, second_body = (r.body for r in anthropic_fake.requests)
    assert first_body["messages"][0]["content"][0] == image
    assert second_body["messages"][0]["content"][0] == image  # the earlier turn's file, read from the thread
    files_key = rt.keys.thread_files(thread.thread_id)
    assert list(rt.redis.hvals(files_key)) == [b64(PNG)]
    assert rt.settings.event_ttl_s < rt.redis.ttl(files_key) <= rt.settings.thread_ttl_s
    assert not rt.redis.exists(rt.keys.attachments(first.turn_id))


def test_a_refused_thread_turn_stores_no_files(client, prefix, anthropic_fake):
    thread = client.create_thread("attach_t.images_only")
    before = prefix_keys(prefix)
    with pytest.raises(SubmitError, match="does not accept application/pdf"):
        client.continue_thread(
            thread.thread_id, prompt="hi", attachments=[Attachment.from_bytes(PDF, "application/pdf")]
        )
    assert prefix_keys(prefix) == before


# --------------------------------------------------------------------------- the chat gateway


def test_the_chat_route_takes_file_parts(prefix: str) -> None:
    """POST /v1/chat with an AI SDK file part (a data: URL): the model gets the file, the thread keeps it;
    a type the agent does not accept is refused naming it, and nothing of it is stored."""

    def message(media_type: str, data: bytes) -> dict[str, Any]:
        url = f"data:{media_type};base64,{b64(data)}"
        parts = [{"type": "file", "mediaType": media_type, "url": url}, {"type": "text", "text": "what is it?"}]
        return {"id": "u-1", "role": "user", "parts": parts}

    with chat_stack(prefix) as stack:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=stack.url, headers=headers, timeout=WAIT) as http:
            body = {"id": "with-file", "messages": [message("image/png", PNG)], "trigger": "submit-message"}
            with http.stream("POST", "/v1/chat?agent=attach_t.images_only", json=body) as response:
                assert response.status_code == 200, response.read()
                chunks = ui_chunks(response)
            said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
            assert said == f"saw: user:what is it? [image/png, {len(PNG)} bytes]"

            thread_id = chunks[0]["messageMetadata"]["threadId"]
            store = redis.Redis.from_url(REDIS_URL, decode_responses=True)
            try:
                files_key = Keys(stack.settings.key_prefix).thread_files(thread_id)
                assert list(store.hvals(files_key)) == [b64(PNG)]
                refused = http.post(
                    "/v1/chat?agent=attach_t.images_only",
                    json={
                        "id": "with-file",
                        "messages": [message("application/pdf", PDF)],
                        "trigger": "submit-message",
                    },
                )
                assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported-media-type"
                assert "attach_t.images_only does not accept application/pdf" in refused.json()["error"]["message"]
                assert list(store.hvals(files_key)) == [b64(PNG)]
            finally:
                store.close()


# --------------------------------------------------------------------------- s3://


class _FakeS3(BaseHTTPRequestHandler):
    """PutObject and GetObject over the S3 REST API (path style); a missing key is NoSuchKey."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []
    objects: dict[str, bytes] = {"/scans-t/cards/card.png": PNG}

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        path = self.path.split("?")[0]
        _FakeS3.seen.append(f"PUT {path}")
        _FakeS3.objects[path] = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("etag", '"fake"')
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        _FakeS3.seen.append(f"{self.headers.get('host')} {self.path} signed={'authorization' in self.headers}")
        found = _FakeS3.objects.get(self.path.split("?")[0])
        if found is not None:
            body, status = found, 200
        else:
            body = b"<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"
            status = 404
        self.send_response(status)
        self.send_header("content-type", "image/png" if status == 200 else "application/xml")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_s3_object_is_read_by_the_worker_through_boto3(prefix, anthropic_fake, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeS3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _isolate_aws(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{server.server_address[1]}")
    settings = make_settings(prefix, attachment_url_allow=["s3://scans-t/cards/"])
    try:
        app = create_app(settings)
        with (
            start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, queues=worker_queues(settings)),
            Client(settings) as client,
        ):
            anthropic_fake.enqueue(a.text_reply("a card"))
            handle = client.submit(
                "attach_t.anthropic", prompt="Read", attachments=[Attachment.from_url("s3://scans-t/cards/card.png")]
            )
            completed(handle)
            block = anthropic_fake.requests[0].body["messages"][0]["content"][0]
            assert block["source"] == {"type": "base64", "media_type": "image/png", "data": b64(PNG)}
            assert any("/scans-t/cards/card.png signed=True" in line for line in _FakeS3.seen)

            with pytest.raises(SubmitError, match="not on STEPQ_ATTACHMENT_URL_ALLOW"):
                client.submit("attach_t.anthropic", prompt="x", attachments=[Attachment.from_url("s3://other/a.png")])

            gone = client.submit(
                "attach_t.anthropic", prompt="Read", attachments=[Attachment.from_url("s3://scans-t/cards/gone.png")]
            )
            result = gone.wait(timeout=WAIT)
            assert result.status == TurnStatus.FAILED
            assert result.error is not None and "s3://scans-t/cards/gone.png failed: NoSuchKey" in result.error
    finally:
        server.shutdown()
        server.server_close()


def test_a_file_above_the_redis_threshold_goes_to_the_object_store_once(prefix, anthropic_fake, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeS3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _isolate_aws(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTEPQTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{server.server_address[1]}")
    settings = make_settings(prefix, attachment_redis_max_bytes=1000, attachment_store_url="s3://store-t/stepq")
    big = b"%PDF-1.7\n" + os.urandom(5000)
    try:
        app = create_app(settings)
        with (
            start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, queues=worker_queues(settings)),
            Client(settings) as client,
        ):
            rt = client.runtime
            _refused(
                client,
                prefix,
                "does not accept application/pdf",
                "attach_t.images_only",
                attachments=[Attachment.from_bytes(big, "application/pdf")],
            )
            assert not [line for line in _FakeS3.seen if line.startswith("PUT ")]  # nothing uploaded either

            anthropic_fake.enqueue(a.text_reply("big"), a.text_reply("small"))
            handle = client.submit(
                "attach_t.anthropic", prompt="Read", attachments=[Attachment.from_bytes(big, "application/pdf")]
            )
            completed(handle)
            uri = f"s3://store-t/stepq/{hashlib.sha256(big).hexdigest()}"
            assert [line for line in _FakeS3.seen if line.startswith("PUT ")] == [f"PUT {uri[4:]}"]
            assert _FakeS3.objects[uri[4:]] == big
            (part,) = json.loads(rt.redis.lrange(rt.keys.messages(handle.turn_id), 0, 0)[0])["files"]
            assert (part["url"], part["attachment_id"], part["size"]) == (uri, None, len(big))
            assert not rt.redis.exists(rt.keys.attachments(handle.turn_id))  # not in Redis
            block = anthropic_fake.requests[0].body["messages"][0]["content"][0]
            assert block["source"] == {"type": "base64", "media_type": "application/pdf", "data": b64(big)}

            with pytest.raises(SubmitError, match="not on STEPQ_ATTACHMENT_URL_ALLOW"):  # callers cannot name it
                client.submit(
                    "attach_t.anthropic", prompt="x", attachments=[Attachment.from_url(uri, "application/pdf")]
                )

            small = client.submit(
                "attach_t.anthropic", prompt="Look", attachments=[Attachment.from_bytes(PNG, "image/png")]
            )
            completed(small)  # below the threshold: Redis, as before
            assert rt.redis.hvals(rt.keys.attachments(small.turn_id)) == [b64(PNG)]
    finally:
        server.shutdown()
        server.server_close()
