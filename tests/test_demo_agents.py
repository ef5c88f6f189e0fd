"""The bundled demo agents do what they are told, on a real worker: `demo.support` looks up the order the
prompt names and reports a denied refund as not issued, `demo.enricher`'s objects are the lead line's own
fields, and `demo.storyteller` streams long enough to stop `stepq events` mid-answer and resume it."""

from __future__ import annotations

import json

import pytest

from stepq import TurnStatus
from stepq.models import EventType
from tests.conftest import settings_env
from tests.test_cli import stepq

WAIT = 120


@pytest.fixture
def env(settings) -> dict[str, str]:
    return settings_env(settings)


def _calls(handle) -> list[tuple[str, dict]]:
    return [(e.data["name"], e.data["args"]) for e in handle.events() if e.type == EventType.TOOL_CALL]


def test_a_denied_refund_is_reported_as_not_issued(worker, env):
    prompt = "My order A-1001 arrived damaged, can I get a refund?"
    proc = stepq(env, "run", "demo.support", prompt, "--deny-all", "--json", check=0)
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert [a["approved"] for a in result["approvals"]] == [False]
    assert "on its way" not in result["text"]
    assert result["text"].startswith("No refund was issued (denied by reviewer: denied with --deny-all)")


def test_the_order_asked_about_is_the_one_looked_up(worker, client):
    handle = client.submit("demo.support", prompt="Where is order A-1002?")
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert _calls(handle) == [("lookup_order", {"order_id": "A-1002"})]  # no refund proposed for a question
    assert result.text.endswith("Order A-1002: the milk frother (39.50 EUR) is in transit.")


def test_a_prompt_naming_no_order_gets_a_question_back(worker, client):
    handle = client.submit("demo.support", prompt="refund please")
    result = handle.wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED
    assert _calls(handle) == []
    assert "Which order is it about?" in result.text


@pytest.mark.parametrize(
    ("employees", "segment"), [(7, "smb"), (250, "mid-market"), (1800, "enterprise")], ids=["7", "250", "1800"]
)
def test_the_enriched_lead_is_the_lines_own(worker, client, employees: int, segment: str):
    prompt = f"company: Pine & Vale, city: Leeds, employees: {employees}"
    result = client.submit("demo.enricher", prompt=prompt).wait(timeout=WAIT)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert result.object == {"company": "Pine & Vale", "city": "Leeds", "employees": employees, "segment": segment}


def test_a_line_the_schema_refuses_fails_instead_of_becoming_another_lead(worker, client):
    result = client.submit("demo.enricher", prompt="company: Pine & Vale, city: Leeds, employees: 0").wait(timeout=WAIT)
    assert result.status == TurnStatus.FAILED
    assert result.object is None
    assert "employees" in (result.error or "") and "greater than or equal to 1" in (result.error or "")


def test_the_storyteller_resumes_where_a_stopped_stepq_events_left_off(worker, client, env):
    handle = client.submit("demo.storyteller", prompt="Tell me a story about a lighthouse")
    seen: list[str] = []
    last = 0
    for event in handle.events(idle_timeout=WAIT):  # a reader that goes away after the first delta
        last = event.seq
        if event.type == EventType.TEXT_DELTA:
            seen.append(event.data["text"])
            break
    assert seen, "the story never started"
    followed = stepq(env, "events", handle.turn_id, "--json", "--after", str(last), check=0).stdout
    events = [json.loads(line) for line in followed.splitlines()]
    assert [e["seq"] for e in events] == list(range(last + 1, last + 1 + len(events)))  # none lost, none twice
    assert events[-1]["type"] == "turn-finish"
    rest = [e["data"]["text"] for e in events if e["type"] == "text-delta"]
    assert len(rest) > 10  # most of the answer came after the first reader left
    result = handle.wait(timeout=WAIT)
    assert "".join(seen + rest) == result.text
    assert result.text.startswith("Here is a slow story about a lighthouse.")
