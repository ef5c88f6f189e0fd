"""The web chat page in a real browser: Playwright driving the system's Chromium (Debian's `chromium`
package; no browser download), headless, against a real uvicorn gateway and a Redis-backed worker.
Every test saves a screenshot under its tmp dir, also when it fails."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.chat_support import API_KEY, SUBMIT_ONLY_KEY, ChatStack, chat_stack

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
Page = sync_api.Page
expect = sync_api.expect

TIMEOUT_MS = 60_000


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("Chromium is not installed: apt-get install -y chromium (the browser test uses the system's)")


@pytest.fixture
def stack(prefix: str) -> Iterator[ChatStack]:
    with chat_stack(prefix) as running:
        yield running


@pytest.fixture
def browser_context(stack: ChatStack) -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1100, "height": 800})
        context.add_init_script(f"localStorage.setItem('stepq.apiKey', {API_KEY!r})")
        context.set_default_timeout(TIMEOUT_MS)
        expect.set_options(timeout=TIMEOUT_MS)
        try:
            yield context
        finally:
            context.close()
            browser.close()


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[list[tuple[Page, str]]]:
    """Pages to photograph when the test ends, pass or fail."""
    pages: list[tuple[Page, str]] = []
    yield pages
    for page, name in pages:
        if not page.is_closed():
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def open_chat(
    context: object,
    stack: ChatStack,
    agent: str,
    shots: list[tuple[Page, str]],
    name: str,
    chat: str | None = None,
    key: str | None = None,
) -> Page:
    """A tab on a new chat, or on `chat`; `key` replaces the context's API key for this tab."""
    page: Page = context.new_page()  # type: ignore[attr-defined]
    shots.append((page, name))
    if key is not None:
        page.add_init_script(f"localStorage.setItem('stepq.apiKey', {key!r})")
    page.goto(f"{stack.url}/?agent={agent}#chat={chat or f'{name}-{uuid.uuid4().hex[:8]}'}")
    page.wait_for_selector("body[data-ready=yes]")
    return page


def say(page: Page, text: str) -> None:
    page.get_by_test_id("input").fill(text)
    page.get_by_test_id("input").press("Enter")


def answer(page: Page) -> sync_api.Locator:
    return page.get_by_test_id("message-assistant").last


def release(stack: ChatStack, turn_id: str) -> None:
    assert httpx.post(f"{stack.control_url}/release/{turn_id}").status_code == 200


def test_type_a_message_and_see_the_streamed_answer(browser_context: object, stack: ChatStack, shots: list) -> None:
    page = open_chat(browser_context, stack, "chat.plain", shots, "streamed")
    say(page, "hello there")
    expect(page.get_by_test_id("message-user")).to_have_text("hello there")
    full = "Hello from stepq: this answer streams to the chat in several small pieces."
    expect(answer(page).get_by_test_id("text")).to_have_text(full)
    expect(answer(page)).to_have_attribute("data-status", "completed")
    reasoning = answer(page).get_by_test_id("reasoning")
    expect(reasoning).to_have_count(1)
    assert reasoning.get_attribute("open") is None, "reasoning starts collapsed"
    expect(page.get_by_test_id("thread")).to_have_count(1)


def test_approve_a_tool_call_and_see_its_result(browser_context: object, stack: ChatStack, shots: list) -> None:
    page = open_chat(browser_context, stack, "chat.gated", shots, "approve")
    say(page, "please record this")
    tool = answer(page).get_by_test_id("tool")
    expect(tool).to_have_attribute("data-state", "approval-requested")
    expect(tool.get_by_test_id("tool-input-row")).to_have_text("labelaudit")
    tool.get_by_test_id("approve").click()
    expect(tool).to_have_attribute("data-state", "output-available")
    expect(tool.get_by_test_id("tool-output-row")).to_have_text("recordedaudit")
    expect(answer(page)).to_have_attribute("data-status", "completed")
    expect(answer(page).get_by_test_id("text")).to_have_text(["I will record it.", "That is settled."])
    expect(page.get_by_test_id("message-assistant")).to_have_count(1)


def test_the_task_plan_is_drawn_above_the_answer_and_advances(
    browser_context: object, stack: ChatStack, shots: list
) -> None:
    page = open_chat(browser_context, stack, "chat.plan", shots, "plan")
    say(page, "what is alpha?")
    expect(answer(page)).to_have_attribute("data-status", "completed")
    steps = answer(page).get_by_test_id("plan").get_by_test_id("plan-step")
    expect(steps).to_have_count(2)  # one plan, updated in place
    expect(steps.nth(0)).to_have_attribute("data-status", "done")
    expect(steps.nth(0)).to_contain_text("Look up alpha")
    expect(steps.nth(1)).to_have_attribute("data-status", "pending")
    first = answer(page).locator(":scope > *").first
    expect(first).to_have_attribute("data-testid", "plan")  # drawn above the answer's other parts


def test_reload_mid_stream_continues_without_duplicated_text(
    browser_context: object, stack: ChatStack, shots: list
) -> None:
    page = open_chat(browser_context, stack, "chat.gate", shots, "reload")
    say(page, "two parts please")
    first = "First part, streamed before the gate."
    expect(answer(page).get_by_test_id("text")).to_have_text([first])
    turn_id = answer(page).get_attribute("data-id")
    assert turn_id and turn_id.startswith("turn_")

    page.reload()  # the turn is still running: its tool waits until released below
    expect(page.get_by_test_id("banner")).to_contain_text("Reconnect")
    expect(answer(page).get_by_test_id("text")).to_have_text([first])
    release(stack, turn_id)
    expect(answer(page)).to_have_attribute("data-status", "completed")
    expect(answer(page).get_by_test_id("text")).to_have_text([first, "Second part, after the gate opened."])
    expect(page.get_by_test_id("message-user")).to_have_text(["two parts please"])
    expect(page.get_by_test_id("message-assistant")).to_have_count(1)
    expect(page.get_by_test_id("banner")).to_be_hidden()


def test_two_tabs_on_two_threads_at_once(browser_context: object, stack: ChatStack, shots: list) -> None:
    waiting = open_chat(browser_context, stack, "chat.gate", shots, "tab-a")
    quick = open_chat(browser_context, stack, "chat.tools", shots, "tab-b")
    say(waiting, "two parts please")
    expect(answer(waiting).get_by_test_id("text")).to_have_text(["First part, streamed before the gate."])
    say(quick, "what is alpha?")  # answered in full while the other tab's turn is still running
    expect(answer(quick)).to_have_attribute("data-status", "completed")
    expect(answer(quick).get_by_test_id("tool-output-row")).to_contain_text(["keyalpha", "valuethe first letter"])
    expect(answer(waiting)).not_to_have_attribute("data-status", "completed")

    release(stack, str(answer(waiting).get_attribute("data-id")))
    expect(answer(waiting)).to_have_attribute("data-status", "completed")
    expect(answer(waiting).get_by_test_id("text")).to_have_text(
        ["First part, streamed before the gate.", "Second part, after the gate opened."]
    )
    expect(quick.get_by_test_id("message-user")).to_have_text(["what is alpha?"])
    expect(waiting.get_by_test_id("message-user")).to_have_text(["two parts please"])
    for page in (waiting, quick):  # each tab lists both chats, its own marked current
        expect(page.get_by_test_id("thread")).to_have_count(2)
        expect(page.locator("[data-testid=thread].current")).to_have_count(1)


def test_a_pending_approval_holds_the_composer_and_a_refused_send_is_rolled_back(
    browser_context: object, stack: ChatStack, shots: list, tmp_path: Path
) -> None:
    chat = f"pending-{uuid.uuid4().hex[:8]}"
    behind = open_chat(browser_context, stack, "chat.gated", shots, "pending-behind", chat)  # it misses the approval
    page = open_chat(browser_context, stack, "chat.gated", shots, "pending", chat)
    say(page, "please record this")
    card = answer(page).get_by_test_id("tool")
    expect(card).to_have_attribute("data-state", "approval-requested")
    expect(page.get_by_test_id("input")).to_be_disabled()  # a new message would be refused: the page says why
    expect(page.get_by_test_id("send")).to_be_disabled()
    expect(page.get_by_test_id("composer-hint")).to_contain_text("Answer the approval above first")

    say(behind, "and one more thing")  # the tab that did not see the approval sends anyway: refused
    banner = behind.get_by_test_id("banner")
    expect(banner).to_contain_text("Your message was not sent")
    expect(banner).not_to_contain_text("/v1/")
    expect(behind.get_by_test_id("message-user")).to_have_text(["please record this"])  # rolled back, re-synced
    expect(behind.get_by_test_id("input")).to_have_value("and one more thing")
    expect(behind.get_by_test_id("input")).to_be_disabled()
    stale = answer(behind).get_by_test_id("tool")
    expect(stale).to_have_attribute("data-state", "approval-requested")
    behind.screenshot(path=str(tmp_path / "refused-send.png"), full_page=True)

    stale.get_by_test_id("deny").click()  # the card is not jammed: its answer goes through
    expect(stale).to_have_attribute("data-state", "output-denied")
    expect(answer(behind)).to_have_attribute("data-status", "completed")
    expect(behind.get_by_test_id("banner")).to_be_hidden()
    expect(behind.get_by_test_id("input")).to_be_enabled()
    expect(behind.get_by_test_id("composer-hint")).to_be_hidden()

    card.get_by_test_id("approve").click()  # the first tab answers too late: it shows what the server decided
    expect(card).to_have_attribute("data-state", "output-denied")
    expect(answer(page)).to_have_attribute("data-status", "completed")
    expect(page.get_by_test_id("message-assistant")).to_have_count(1)


def test_a_refused_approval_answer_puts_the_card_back_and_says_why(
    browser_context: object, stack: ChatStack, shots: list
) -> None:
    page = open_chat(browser_context, stack, "chat.gated", shots, "no-approve", key=SUBMIT_ONLY_KEY)
    say(page, "please record this")
    card = answer(page).get_by_test_id("tool")
    expect(card).to_have_attribute("data-state", "approval-requested")
    card.get_by_test_id("deny").click()  # this key may submit but not approve: the gateway refuses (403)
    expect(page.get_by_test_id("banner")).to_contain_text("Your key is not allowed")
    expect(page.get_by_test_id("banner")).not_to_contain_text("scope")
    expect(card).to_have_attribute("data-state", "approval-requested")  # as the server has it: still waiting
    expect(card.get_by_test_id("approve")).to_be_visible()
    expect(page.get_by_test_id("input")).to_be_disabled()
