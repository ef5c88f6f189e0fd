"""The chat page as a person uses it, in a real Chromium against a real gateway and worker (one of each for
the module): Markdown rendered and sanitized, readable tool cards, Stop, starter chips, the agent menu,
a wrong key, a phone-sized screen. Every test saves screenshots of its pages under its tmp dir."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from stepq.providers.function import _DELTA_CHARS as PIECE_CHARS
from tests.agents_chat import HELD_PIECES, LONG_KEY, gate_key
from tests.browser_fixtures import chromium, context, shots, stack  # noqa: F401 (the module's fixtures)
from tests.browser_support import Shots, new_context
from tests.chat_support import API_KEY, ChatStack

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
expect = sync_api.expect


def open_chat(context: Any, stack: ChatStack, shots: Shots, name: str, agent: str | None = None) -> Any:
    page = shots.add(context.new_page(), name)
    query = f"?agent={agent}" if agent else ""
    page.goto(f"{stack.url}/{query}#chat={name}-{uuid.uuid4().hex[:8]}")
    page.wait_for_selector("body[data-ready=yes]")
    return page


def answer(page: Any) -> Any:
    return page.get_by_test_id("message-assistant").last


def say(page: Any, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")


def test_a_suggestion_chip_sends_its_prompt_and_the_markdown_answer_is_rendered_and_inert(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    page = open_chat(context, stack, shots, "markdown", "chat.suggests")
    chips = page.get_by_test_id("suggestion")
    expect(chips).to_have_text(["What can you do?", "Show me some code"])
    chips.nth(1).click()
    expect(page.get_by_test_id("message-user")).to_have_text("show me a code sample")  # the chip's prompt
    expect(page.get_by_label("Message")).to_be_focused()  # focus back in the labelled message box
    expect(answer(page)).to_have_attribute("data-status", "completed")
    expect(page.get_by_test_id("suggestions")).to_be_hidden()  # the chat has started

    text = answer(page).get_by_test_id("text")
    expect(text.locator("h2")).to_have_text("Here it is")
    expect(text.locator("strong")).to_have_text("bold")
    expect(text.locator("li")).to_have_text(["one", "two"])
    expect(text.locator("pre code")).to_have_text("print('hi')")
    # the model's HTML is shown as text: no element made from it, nothing of it ran
    expect(text).to_contain_text('<img src="x" onerror="window.__pwned = 1">')
    expect(text).to_contain_text("<script>window.__pwned = 2</script>")
    expect(page.get_by_test_id("messages").locator("img, script")).to_have_count(0)
    assert text.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))") in ([], [None])
    assert page.evaluate("window.__pwned") is None


def test_a_tool_card_names_the_tool_tables_its_arguments_and_says_what_it_waits_for(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    page = open_chat(context, stack, shots, "tool-card", "chat.gated")
    say(page, "please record this")
    card = answer(page).get_by_test_id("tool")
    expect(card.get_by_test_id("tool-status")).to_have_text("waiting for your approval")
    expect(card.get_by_test_id("tool-name")).to_have_text("Chat record")
    row = card.get_by_test_id("tool-input-row")
    expect(row.locator("th")).to_have_text("label")
    expect(row.locator("td")).to_have_text("audit")
    card.get_by_test_id("approve").click()
    expect(card.get_by_test_id("tool-status")).to_have_text("done")
    expect(card.get_by_test_id("tool-output-row").locator("th")).to_have_text("recorded")
    expect(card.get_by_test_id("tool-output-row").locator("td")).to_have_text("audit")
    expect(answer(page)).to_have_attribute("data-status", "completed")
    for sdk_word in ("output-available", "approval-requested", "input-available"):
        expect(page.get_by_test_id("messages")).not_to_contain_text(sdk_word)


def test_a_tool_calls_arguments_show_as_they_stream_and_the_table_replaces_them(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    page = open_chat(context, stack, shots, "tool-input", "chat.held_input")
    token = f"input-{uuid.uuid4().hex[:8]}"
    say(page, f"look it up; hold {gate_key(stack.settings.key_prefix, token)}")
    card = answer(page).get_by_test_id("tool")
    arguments = json.dumps({"key": LONG_KEY})
    streamed = arguments[: HELD_PIECES * PIECE_CHARS]  # the pieces sent before the model holds its step
    expect(card).to_have_attribute("data-state", "input-streaming")
    expect(card.get_by_test_id("tool-status")).to_have_text("preparing")
    expect(card.get_by_test_id("tool-input-streaming")).to_have_text(streamed)
    expect(card.get_by_test_id("tool-input-row")).to_have_count(0)
    assert httpx.post(f"{stack.control_url}/release/{token}").status_code == 200
    expect(card.get_by_test_id("tool-status")).to_have_text("done")
    expect(card.get_by_test_id("tool-input-streaming")).to_have_count(0)  # the whole arguments, as a table
    expect(card.get_by_test_id("tool-input-row").locator("td")).to_have_text(LONG_KEY)
    expect(answer(page)).to_have_attribute("data-status", "completed")


def test_stop_cancels_the_turn_being_answered(context: Any, stack: ChatStack, shots: Shots) -> None:
    page = open_chat(context, stack, shots, "stop", "chat.gate")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_hidden()
    say(page, "two parts please")
    expect(answer(page).get_by_test_id("text")).to_have_text(["First part, streamed before the gate."])
    turn_id = str(answer(page).get_attribute("data-id"))
    with page.expect_response(lambda r: r.url.endswith(f"/v1/turns/{turn_id}/cancel")) as cancelled:
        stop.click()
    assert cancelled.value.status == 202
    # its tool still holds the step: let it return, and the cancelled turn takes no next step
    assert httpx.post(f"{stack.control_url}/release/{turn_id}").status_code == 200
    expect(answer(page)).to_have_attribute("data-status", "cancelled")
    expect(answer(page).get_by_test_id("stopped")).to_have_text("Stopped.")
    expect(answer(page).get_by_test_id("text")).to_have_text(["First part, streamed before the gate."])
    expect(page.get_by_test_id("stop")).to_be_hidden()
    state = httpx.get(f"{stack.url}/v1/turns/{turn_id}", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert state["status"] == "cancelled"


def test_the_default_agent_is_a_chat_agent_and_the_choice_survives_a_reload(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    page = open_chat(context, stack, shots, "agent-menu")
    agents = httpx.get(f"{stack.url}/v1/agents", headers={"Authorization": f"Bearer {API_KEY}"}).json()["agents"]
    assert agents[0]["execution_mode"] == "object"  # the first agent listed would be the wrong default
    modes = {a["id"]: a["execution_mode"] for a in agents}
    menu = page.get_by_label("Agent")
    assert modes[menu.input_value()] == "chat"
    menu.select_option("chat.tools")
    page.reload()
    page.wait_for_selector("body[data-ready=yes]")
    expect(page.get_by_label("Agent")).to_have_value("chat.tools")
    say(page, "what is alpha?")
    expect(answer(page)).to_have_attribute("data-status", "completed")
    expect(answer(page).get_by_test_id("tool-name")).to_have_text("Chat lookup")  # it talked to chat.tools


def test_a_wrong_key_is_named_as_such_and_a_right_one_lets_the_page_in(
    chromium: Any, stack: ChatStack, shots: Shots
) -> None:
    with new_context(chromium, sync_api, shots, key="not-a-key") as ctx:
        page = shots.add(ctx.new_page(), "wrong-key")
        page.goto(f"{stack.url}/?agent=chat.plain")
        expect(page.get_by_test_id("key-dialog")).to_be_visible()
        expect(page.get_by_test_id("key-error")).to_contain_text("That key was not accepted")
        shots.save()  # the dialog with its message (taken again at the end)
        page.get_by_label("API key", exact=True).fill(API_KEY)
        page.get_by_label("API key", exact=True).press("Enter")
        page.wait_for_selector("body[data-ready=yes]")
        expect(page.get_by_test_id("key-dialog")).to_be_hidden()


WORDS_BROKEN = """() => {
  const broken = [];
  const walker = document.createTreeWalker(document.getElementById('messages'), NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const re = /\\S+/g;
    let m;
    while ((m = re.exec(node.data))) {
      if (m[0].length > 24) continue;  // longer than any line: it has to wrap somewhere
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
  return broken;
}"""


def test_at_390_px_the_conversation_gets_the_width_and_no_word_is_broken(
    chromium: Any, stack: ChatStack, shots: Shots
) -> None:
    with new_context(chromium, sync_api, shots, width=390) as ctx:
        page = open_chat(ctx, stack, shots, "phone", "chat.gated")
        say(page, "please record this, and say a little more about what you will do with it")
        card = answer(page).get_by_test_id("tool")
        expect(card.get_by_test_id("tool-status")).to_have_text("waiting for your approval")
        column = page.get_by_test_id("messages").bounding_box()
        assert column is not None and column["width"] >= 370, column
        bubble = answer(page).bounding_box()
        assert bubble is not None and bubble["width"] >= 300, bubble
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing sticks out sideways
        assert page.evaluate(WORDS_BROKEN) == []
        expect(page.get_by_role("button", name="Approve")).to_be_visible()


def test_the_chat_list_comes_from_the_server_so_a_chat_started_elsewhere_opens_here(
    context: Any, stack: ChatStack, shots: Shots
) -> None:
    title = f"hello from another device {uuid.uuid4().hex[:6]}"
    body = {
        "id": f"elsewhere-{uuid.uuid4().hex[:8]}",
        "messages": [{"role": "user", "parts": [{"type": "text", "text": title}]}],
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", f"{stack.url}/v1/chat?agent=chat.plain", json=body, headers=headers, timeout=60) as sent:
        assert sent.status_code == 200
        assert any(line == "data: [DONE]" for line in sent.iter_lines())  # answered in full
    page = open_chat(context, stack, shots, "server-list", "chat.plain")  # a browser that never saw that chat
    listed = page.get_by_test_id("thread").filter(has_text=title)
    expect(listed).to_have_count(1)
    listed.click()
    expect(page.get_by_test_id("message-user")).to_have_text([title])
    expect(answer(page).get_by_test_id("text")).to_contain_text("Hello from stepq")
    expect(page.locator("[data-testid=thread].current")).to_have_text(title)
