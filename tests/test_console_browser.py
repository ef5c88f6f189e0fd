"""The operator console at /console in a real Chromium, against a real gateway and worker (one of each for
the module): find a parked turn, approve it from the inbox and watch it finish; open a turn's timeline;
cancel a running turn from its page; a batch's progress. Every test saves screenshots under its tmp dir.
Also the tenant matrix of the two routes the console added (a turn's trace, a batch's status)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest

from stepq.producer.client import Client
from tests.browser_fixtures import chromium, context, shots, stack  # noqa: F401 (the module's fixtures)
from tests.browser_support import Shots
from tests.chat_support import API_KEY, OTHER_TENANT_KEY, SUBMIT_ONLY_KEY, ChatStack

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
expect = sync_api.expect


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def submit(stack: ChatStack, agent: str, prompt: str) -> str:
    answer = httpx.post(f"{stack.url}/v1/turns", json={"agent": agent, "prompt": prompt}, headers=auth(), timeout=30)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["turn_id"])


def finished(stack: ChatStack, turn_id: str) -> dict[str, Any]:
    """The turn once it has ended (its event stream closes after `turn-finish`)."""
    with httpx.stream("GET", f"{stack.url}/v1/turns/{turn_id}/events", headers=auth(), timeout=60) as events:
        for _ in events.iter_lines():
            pass
    state: dict[str, Any] = httpx.get(f"{stack.url}/v1/turns/{turn_id}", headers=auth()).json()
    return state


def console(context: Any, stack: ChatStack, shots: Shots, name: str, hash_path: str) -> Any:
    page = shots.add(context.new_page(), name)
    page.goto(f"{stack.url}/console#{hash_path}")
    page.wait_for_selector("body[data-ready=yes]")
    return page


def test_find_a_parked_turn_approve_it_from_the_inbox_and_watch_it_finish(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    turn_id = submit(stack, "chat.gated", "please record this")
    page = console(context, stack, shots, "inbox", "/turns?status=awaiting_approval")
    row = page.locator(f"[data-testid=turn-row][data-turn='{turn_id}']")
    expect(row.get_by_test_id("status")).to_have_attribute("data-status", "awaiting_approval")  # found, live

    page.get_by_test_id("nav-approvals").click()
    waiting = page.locator(f"[data-testid=approval-row][data-turn='{turn_id}']")
    expect(waiting).to_contain_text("chat_record")
    expect(waiting.get_by_test_id("args")).to_have_text("label = audit")
    waiting.get_by_test_id("approve").click()
    expect(waiting.get_by_test_id("decided")).to_have_text("approved by k-chat-tests")  # the signed-in principal
    expect(waiting.get_by_test_id("turn-live").get_by_test_id("status")).to_have_attribute("data-status", "completed")
    assert httpx.get(f"{stack.url}/v1/turns/{turn_id}", headers=auth()).json()["status"] == "completed"

    page.get_by_test_id("decided-tab").click()
    decided = page.locator(f"[data-testid=approval-row][data-turn='{turn_id}']")
    expect(decided).to_contain_text("approved")
    expect(decided).to_contain_text("k-chat-tests")


def test_open_a_turn_and_read_its_step_timeline(context: Any, stack: ChatStack, shots: Shots) -> None:
    turn_id = submit(stack, "chat.tools", "what is alpha?")
    assert finished(stack, turn_id)["status"] == "completed"
    page = console(context, stack, shots, "timeline", "/turns?agent=chat.tools")
    page.locator(f"[data-testid=turn-row][data-turn='{turn_id}']").get_by_test_id("turn-link").click()
    page.wait_for_selector("body[data-ready=yes]")
    steps = page.get_by_test_id("tl-step")
    expect(steps).to_have_count(2)
    first = steps.nth(0)
    expect(first).to_contain_text("scripted/")  # the model it ran on
    expect(first.get_by_test_id("tl-usage")).to_contain_text("tokens")
    expect(first.get_by_test_id("tl-cost")).to_be_visible()
    tool = first.get_by_test_id("tl-tool")
    expect(tool).to_have_attribute("data-tool", "chat_lookup")
    expect(tool).to_contain_text("ok")
    expect(tool).to_contain_text(" s")  # its duration ...
    trace = httpx.get(f"{stack.url}/v1/turns/{turn_id}/trace", headers=auth()).json()
    [call] = trace["steps"][0]["calls"]
    assert call["duration_s"] is not None
    expect(tool).to_have_attribute("data-duration", re.compile(r"^[0-9.e+-]+$"))  # ... as the trace measured it
    assert float(tool.get_attribute("data-duration") or "nan") == call["duration_s"]
    expect(tool).to_contain_text('{"key":"alpha"}')
    expect(first.get_by_test_id("tl-text")).to_have_text("Looking it up.")
    expect(steps.nth(1).get_by_test_id("tl-text")).to_have_text("Alpha is the first letter.")
    expect(page.get_by_test_id("result")).to_have_text("Alpha is the first letter.")
    expect(page.get_by_test_id("cancel")).to_be_disabled()  # it has finished

    page.get_by_test_id("fork-step").select_option("1")  # ask the model again from step 2, step 1's lookup reused
    page.get_by_test_id("fork").click()
    expect(page.get_by_test_id("turn-facts")).to_contain_text(f"{turn_id} at step 2")
    expect(page.get_by_test_id("turn-facts").get_by_test_id("status")).to_have_attribute("data-status", "completed")


def test_cancel_a_running_turn_from_its_page_while_its_timeline_follows_it(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    turn_id = submit(stack, "chat.gate", "two parts please")
    page = console(context, stack, shots, "cancel", f"/turn/{turn_id}")
    tool = page.get_by_test_id("tl-tool")
    expect(tool).to_have_attribute("data-tool", "chat_wait")  # streamed in live: the tool holds the step
    expect(page.get_by_test_id("tl-text")).to_have_text("First part, streamed before the gate.")
    with page.expect_response(lambda r: r.url.endswith(f"/v1/turns/{turn_id}/cancel")) as cancelled:
        page.get_by_test_id("cancel").click()
    assert cancelled.value.status == 202
    assert httpx.post(f"{stack.control_url}/release/{turn_id}").status_code == 200
    expect(page.get_by_test_id("turn-facts").get_by_test_id("status")).to_have_attribute("data-status", "cancelled")
    expect(page.get_by_test_id("tl-text")).to_have_count(1)  # no second step ran


def test_a_batch_shows_its_progress(context: Any, stack: ChatStack, shots: Shots) -> None:
    tenant = stack.settings.key_prefix
    batch = f"b-{uuid.uuid4().hex[:8]}"
    items = [{"key": k, "prompt": "hello", "metadata": {"tenant": tenant}} for k in ("one", "two")]
    with Client(stack.settings) as client:
        _, handles = client.submit_batch("chat.plain", items, key=batch)
        for handle in handles:
            handle.wait(timeout=60)
    page = console(context, stack, shots, "batches", "/batches")
    row = page.locator(f"[data-testid=batch-row][data-batch='{batch}']")
    expect(row.get_by_test_id("batch-progress")).to_have_text("2/2")
    expect(row).to_contain_text("chat.plain")


def test_the_trace_and_batch_routes_answer_only_their_tenant(stack: ChatStack) -> None:
    turn_id = submit(stack, "chat.tools", "what is alpha?")
    assert finished(stack, turn_id)["status"] == "completed"
    tenant = stack.settings.key_prefix
    batch = f"b-{uuid.uuid4().hex[:8]}"
    with Client(stack.settings) as client:
        _, handles = client.submit_batch(
            "chat.plain", [{"key": "k", "prompt": "hi", "metadata": {"tenant": tenant}}], key=batch
        )
        handles[0].wait(timeout=60)
    trace, status = f"{stack.url}/v1/turns/{turn_id}/trace", f"{stack.url}/v1/batches/{batch}"
    mine = httpx.get(trace, headers=auth(SUBMIT_ONLY_KEY))
    assert mine.status_code == 200
    assert [s["step"] for s in mine.json()["steps"]] == [0, 1]
    assert mine.json()["steps"][0]["tool_calls"] == ["chat_lookup"]
    progress = httpx.get(status, headers=auth()).json()
    assert (progress["total"], progress["finished"], progress["agent"]) == (1, 1, "chat.plain")
    for url in (trace, status, f"{stack.url}/v1/batches/no-such-batch", f"{stack.url}/v1/batches/bad id!"):
        other = httpx.get(url, headers=auth(OTHER_TENANT_KEY))
        assert other.status_code == 404, (url, other.text)
        assert "not yours" in other.json()["error"]["message"]
    assert httpx.get(trace).status_code == 401
