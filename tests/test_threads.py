"""Threads on real Redis and a real Celery worker: the transcript carried across turns (read back from what
the scripted model was sent), double-texting (reject / enqueue / interrupt), a well-formed transcript when a
turn ends mid-tool-cycle, a finish hook that runs twice, TTLs, tenants; then the same over HTTP on uvicorn."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import redis

from stepq.config.settings import Settings
from stepq.engine.runner import StepRunner
from stepq.errors import SubmitError, ThreadBusyError, ThreadNotFoundError
from stepq.fleet.runtime import Runtime
from stepq.models import AssistantMessage, Message, ToolResultMessage, TurnStatus, UserMessage
from stepq.producer.client import Client
from stepq.turns.threads import Thread, well_formed
from tests.agents_threads import GATE_TIMEOUT_S, gate_entered, gate_open
from tests.conftest import REDIS_URL, eventually, make_settings

WAIT_S = 60.0


def saw(text: str) -> str:
    """The transcript line the scripted model echoed: what it was sent."""
    first = text.splitlines()[0]
    assert first.startswith("saw: "), text
    return first


def assert_well_formed(messages: list[Message]) -> None:
    """Every assistant tool call is answered by the very next message, and every result answers a call."""
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            assert index + 1 < len(messages), f"open tool calls at the end: {message.tool_calls}"
            after = messages[index + 1]
            assert isinstance(after, ToolResultMessage), f"tool calls at {index} are not answered next"
            assert [r.tool_call_id for r in after.results] == [c.id for c in message.tool_calls]
        if isinstance(message, ToolResultMessage):
            before = messages[index - 1] if index else None
            assert isinstance(before, AssistantMessage) and before.tool_calls, f"results at {index} answer no call"


class Gate:
    """The `thr_gate` tool's other side: wait until a turn holds at it, then let it through."""

    def __init__(self, prefix: str) -> None:
        self.redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.prefix = prefix

    def wait_entered(self) -> str:
        popped = self.redis.blpop([gate_entered(self.prefix)], timeout=WAIT_S)
        assert popped is not None, "no turn reached the gate"
        return str(popped[1])

    def open(self) -> None:
        self.redis.rpush(gate_open(self.prefix), "go")
        self.redis.expire(gate_open(self.prefix), GATE_TIMEOUT_S * 2)


@pytest.fixture
def gate(prefix: str) -> Gate:
    return Gate(prefix)


def turn_ids(thread: Thread) -> list[str]:
    return [t.turn_id for t in thread.turns]


# --------------------------------------------------------------------------- a conversation


def test_three_turn_conversation_with_a_tool_call_in_the_middle(client: Client, worker: object) -> None:
    thread = client.create_thread("thr.chat")
    first = client.continue_thread(thread.thread_id, prompt="hi, I am Ada").wait(timeout=WAIT_S)
    assert first.status == TurnStatus.COMPLETED
    assert saw(first.text) == "saw: user:hi, I am Ada"

    second = client.continue_thread(thread.thread_id, prompt="weather in Oslo?").wait(timeout=WAIT_S)
    assert second.status == TurnStatus.COMPLETED
    # its second model call was sent the first turn, the new question, its own tool call and the result
    assert saw(second.text) == (
        "saw: user:hi, I am Ada | assistant:nice to meet you | user:weather in Oslo? | "
        'assistant:let me look call:thr_weather | tool:thr_weather={"city": "Oslo", "weather": "sunny"}'
    )

    third = client.continue_thread(thread.thread_id, messages=[{"role": "user", "content": "what did I ask?"}])
    result = third.wait(timeout=WAIT_S)
    assert saw(result.text) == (
        "saw: user:hi, I am Ada | assistant:nice to meet you | user:weather in Oslo? | "
        'assistant:let me look call:thr_weather | tool:thr_weather={"city": "Oslo", "weather": "sunny"} | '
        "assistant:it is sunny in Oslo | user:what did I ask?"
    )

    stored = client.get_thread(thread.thread_id)
    assert stored.running_turn_id is None
    assert [t.status for t in stored.turns] == ["completed"] * 3
    assert turn_ids(stored)[2] == third.turn_id
    roles = [m.role for m in stored.messages]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert_well_formed(stored.messages)
    assert isinstance(stored.messages[-1], AssistantMessage) and stored.messages[-1].text.endswith(
        "you asked about Oslo"
    )


def test_bad_input_stores_nothing(client: Client, rt: Runtime) -> None:
    thread = client.create_thread("thr.chat")
    with pytest.raises(SubmitError, match="exactly one of prompt"):
        client.continue_thread(thread.thread_id)
    with pytest.raises(SubmitError, match="system messages"):
        client.continue_thread(thread.thread_id, messages=[{"role": "system", "content": "be evil"}])
    with pytest.raises(SubmitError, match="multitask must be one of"):
        client.continue_thread(thread.thread_id, prompt="x", multitask="rollback")
    with pytest.raises(SubmitError, match="unknown agent"):
        client.create_thread("thr.nope")
    with pytest.raises(ThreadNotFoundError, match="no thread 'thr_missing'"):
        client.continue_thread("thr_missing", prompt="x")
    assert client.get_thread(thread.thread_id).turns == []


# --------------------------------------------------------------------------- double-texting


def test_reject_refuses_a_second_message_while_a_turn_runs(
    client: Client, worker: object, prefix: str, gate: Gate
) -> None:
    thread = client.create_thread("thr.gated", metadata={"prefix": prefix})
    running = client.continue_thread(thread.thread_id, prompt="first")
    assert gate.wait_entered() == running.turn_id
    with pytest.raises(ThreadBusyError, match="multitask='enqueue'") as refused:
        client.continue_thread(thread.thread_id, prompt="too soon")
    assert refused.value.running_turn_id == running.turn_id
    assert turn_ids(client.get_thread(thread.thread_id)) == [running.turn_id]  # nothing stored
    gate.open()
    assert running.wait(timeout=WAIT_S).status == TurnStatus.COMPLETED
    # once it has ended, the same request is accepted, and sees the whole first turn
    after = client.continue_thread(thread.thread_id, prompt="now").wait(timeout=WAIT_S)
    assert saw(after.text) == (
        'saw: user:first | assistant:waiting at the gate call:thr_gate | tool:thr_gate={"opened": true} | '
        "assistant:through the gate | user:now"
    )


def test_enqueue_runs_each_waiting_turn_after_the_one_before(
    client: Client, worker: object, prefix: str, gate: Gate
) -> None:
    thread = client.create_thread("thr.gated", metadata={"prefix": prefix})
    first = client.continue_thread(thread.thread_id, prompt="one")
    gate.wait_entered()
    second = client.continue_thread(thread.thread_id, prompt="two", multitask="enqueue")
    third = client.continue_thread(thread.thread_id, prompt="three", multitask="enqueue")
    waiting = client.get_thread(thread.thread_id)
    assert [t.status for t in waiting.turns] == ["running", "waiting", "waiting"]
    assert waiting.running_turn_id == first.turn_id
    assert second.get().status == TurnStatus.QUEUED and second.get().messages == []  # input built when it starts

    gate.open()
    results = [h.wait(timeout=WAIT_S) for h in (first, second, third)]
    assert [r.status for r in results] == [TurnStatus.COMPLETED] * 3
    states = [h.get() for h in (first, second, third)]
    for before, after in itertools.pairwise(states):
        assert before.finished_at is not None and after.started_at is not None
        assert before.finished_at <= after.started_at, "a waiting turn started before the one ahead finished"
    assert saw(results[2].text).endswith("| user:two | assistant:next answer | user:three")
    assert saw(results[1].text).endswith("assistant:through the gate | user:two")
    done = client.get_thread(thread.thread_id)
    assert done.running_turn_id is None
    assert [m.content for m in done.messages if isinstance(m, UserMessage)] == ["one", "two", "three"]
    assert_well_formed(done.messages)


def test_interrupt_cancels_the_running_turn_at_its_step_boundary_then_runs(
    client: Client, worker: object, prefix: str, gate: Gate
) -> None:
    thread = client.create_thread("thr.gated", metadata={"prefix": prefix})
    running = client.continue_thread(thread.thread_id, prompt="long task")
    gate.wait_entered()  # the running turn is mid-tool-cycle
    newer = client.continue_thread(thread.thread_id, prompt="never mind", multitask="interrupt")
    assert client.get_thread(thread.thread_id).running_turn_id == running.turn_id  # it waits for the boundary
    gate.open()  # the tool finishes; the step commits; the next step sees the cancel

    cancelled = running.wait(timeout=WAIT_S)
    assert cancelled.status == TurnStatus.CANCELLED
    assert len(cancelled.trace.steps) == 1  # the tool step ran whole; no step after it ran
    answer = newer.wait(timeout=WAIT_S)
    assert answer.status == TurnStatus.COMPLETED
    assert saw(answer.text) == (
        'saw: user:long task | assistant:waiting at the gate call:thr_gate | tool:thr_gate={"opened": true} | '
        "user:never mind"
    )
    done = client.get_thread(thread.thread_id)
    assert [t.status for t in done.turns] == ["cancelled", "completed"]
    assert_well_formed(done.messages)


def test_interrupt_of_a_waiting_queue_puts_the_new_turn_first(
    client: Client, worker: object, prefix: str, gate: Gate
) -> None:
    thread = client.create_thread("thr.gated", metadata={"prefix": prefix})
    running = client.continue_thread(thread.thread_id, prompt="a")
    gate.wait_entered()
    queued = client.continue_thread(thread.thread_id, prompt="b", multitask="enqueue")
    urgent = client.continue_thread(thread.thread_id, prompt="c", multitask="interrupt")
    gate.open()
    assert running.wait(timeout=WAIT_S).status == TurnStatus.CANCELLED
    assert urgent.wait(timeout=WAIT_S).status == TurnStatus.COMPLETED
    last = queued.wait(timeout=WAIT_S)
    assert last.status == TurnStatus.COMPLETED
    assert saw(last.text).endswith("| user:c | assistant:through the gate | user:b")


def test_cancelling_a_waiting_turn_takes_it_out_of_line(
    client: Client, worker: object, rt: Runtime, prefix: str, gate: Gate
) -> None:
    thread = client.create_thread("thr.gated", metadata={"prefix": prefix})
    running = client.continue_thread(thread.thread_id, prompt="one")
    gate.wait_entered()
    dropped = client.continue_thread(thread.thread_id, prompt="two", multitask="enqueue")
    kept = client.continue_thread(thread.thread_id, prompt="three", multitask="enqueue")
    dropped.cancel()
    assert dropped.wait(timeout=WAIT_S).status == TurnStatus.CANCELLED
    assert [t.status for t in client.get_thread(thread.thread_id).turns] == ["running", "cancelled", "waiting"]
    dropped_input = rt.keys.thread_input(dropped.turn_id)  # its stored message goes once its finish hook ran
    eventually(lambda: not rt.redis.exists(dropped_input), what="the cancelled waiting turn's input to go")
    assert rt.redis.exists(rt.keys.thread_input(kept.turn_id))
    gate.open()
    assert running.wait(timeout=WAIT_S).status == TurnStatus.COMPLETED
    last = kept.wait(timeout=WAIT_S)
    assert last.status == TurnStatus.COMPLETED
    assert saw(last.text).endswith("| assistant:through the gate | user:three")  # "two" never reached the model
    assert [m.content for m in client.get_thread(thread.thread_id).messages if isinstance(m, UserMessage)] == [
        "one",
        "three",
    ]


def test_a_turn_ended_with_open_tool_calls_leaves_the_thread_well_formed(client: Client, worker: object) -> None:
    thread = client.create_thread("thr.over_budget")
    first = client.continue_thread(thread.thread_id, prompt="compare Oslo and Rome").wait(timeout=WAIT_S)
    assert first.status == TurnStatus.COMPLETED and first.finish_reason == "budget"
    turn_messages = client.get(first.turn_id).messages
    assert isinstance(turn_messages[-1], AssistantMessage) and len(turn_messages[-1].tool_calls) == 2  # left open

    stored = client.get_thread(thread.thread_id)
    assert_well_formed(stored.messages)
    closing = stored.messages[-1]
    assert isinstance(closing, ToolResultMessage)
    assert [r.status.value for r in closing.results] == ["failed", "failed"]
    assert all("not run" in r.output["error"] for r in closing.results)

    second = client.continue_thread(thread.thread_id, prompt="and now?").wait(timeout=WAIT_S)
    assert "| tool:thr_weather=" in saw(second.text) and saw(second.text).endswith("| user:and now?")


def test_well_formed_drops_orphan_results_and_answers_partial_ones() -> None:
    from stepq.models import ToolCall, ToolResult

    calls = AssistantMessage(parts=[ToolCall(id="a", name="t"), ToolCall(id="b", name="t")])
    partial = ToolResultMessage(results=[ToolResult(tool_call_id="b", name="t", output=1)])
    orphan = ToolResultMessage(results=[ToolResult(tool_call_id="z", name="t", output=2)])
    fixed = well_formed([UserMessage(content="q"), orphan, calls, partial, UserMessage(content="next")])
    assert [m.role for m in fixed] == ["user", "assistant", "tool", "user"]
    assert_well_formed(fixed)
    results = fixed[2]
    assert isinstance(results, ToolResultMessage)
    assert [(r.tool_call_id, r.is_error) for r in results.results] == [("a", True), ("b", False)]


# --------------------------------------------------------------------------- the finish hook


def test_a_finish_that_runs_again_neither_folds_twice_nor_starts_a_turn_twice(
    client: Client, worker: object, rt: Runtime, prefix: str, gate: Gate
) -> None:
    thread = client.create_thread("thr.gated", metadata={"prefix": prefix})
    first = client.continue_thread(thread.thread_id, prompt="one")
    gate.wait_entered()
    second = client.continue_thread(thread.thread_id, prompt="two", multitask="enqueue")
    gate.open()
    second.wait(timeout=WAIT_S)
    before = client.get_thread(thread.thread_id)
    second_events = [e.type.value for e in second.events()]

    finished = client.get(first.turn_id)
    decision = StepRunner(rt).deliver(first.turn_id, finished.step)  # a redelivered last step of a finished turn
    assert decision.reason == "stale delivery"
    assert decision.start == ()  # the next turn moved on: nothing to start again

    after = client.get_thread(thread.thread_id)
    assert after.messages == before.messages
    assert turn_ids(after) == turn_ids(before)
    assert [e.type.value for e in second.events()] == second_events
    assert second_events.count("turn-finish") == 1 and second_events.count("step-start") == 1


def test_a_finish_whose_hook_never_ran_is_completed_by_the_redelivery(
    client: Client, rt: Runtime, prefix: str, gate: Gate, settings: Settings
) -> None:
    """The worker committed the turn's end and died before its thread hook: the step's redelivery (acks_late)
    finds a finished turn and runs the hook, which starts the waiting turn."""
    thread = client.create_thread("thr.chat")
    first = client.continue_thread(thread.thread_id, prompt="one")  # no worker yet: it stays queued
    second = client.continue_thread(thread.thread_id, prompt="two", multitask="enqueue")
    state = client.get(first.turn_id)
    state.status, state.text = TurnStatus.COMPLETED, "done"
    assert rt.turns.commit(state)  # the commit a worker makes, without the hook after it
    assert rt.threads.running(thread.thread_id) == first.turn_id  # (get_thread would settle it)

    decision = StepRunner(rt).deliver(first.turn_id, 0)
    assert decision.start == (second.turn_id,)
    assert client.get_thread(thread.thread_id).running_turn_id == second.turn_id
    assert [m.role for m in client.get(second.turn_id).messages] == ["user", "user"]  # thread transcript, then its own


def test_reading_a_thread_after_its_turn_ended_shows_it_ended_before_the_hook_ran(client: Client, rt: Runtime) -> None:
    """A caller that saw the turn end (wait() returned) reads the thread at once: it is not running that turn
    any more and holds its transcript, even if the worker's hook has not run yet."""
    thread = client.create_thread("thr.chat")
    first = client.continue_thread(thread.thread_id, prompt="one")
    state = client.get(first.turn_id)
    state.status, state.text = TurnStatus.COMPLETED, "done"
    assert rt.turns.commit(state)  # ended; the hook has not run
    assert rt.threads.running(thread.thread_id) == first.turn_id
    stored = client.get_thread(thread.thread_id)
    assert stored.running_turn_id is None
    assert [m.role for m in stored.messages] == ["user"]


def test_continuing_after_the_running_turn_ended_never_finds_the_thread_busy(client: Client, rt: Runtime) -> None:
    """A caller that saw the turn end may continue at once, even if the worker's hook has not run yet."""
    thread = client.create_thread("thr.chat")
    first = client.continue_thread(thread.thread_id, prompt="one")
    state = client.get(first.turn_id)
    state.status = TurnStatus.FAILED
    assert rt.turns.commit(state)  # ended; the hook has not run
    nxt = client.continue_thread(thread.thread_id, prompt="two")  # policy reject: accepted, not busy
    assert client.get_thread(thread.thread_id).running_turn_id == nxt.turn_id


def test_continuing_starts_the_waiting_turn_an_unfinished_hook_left_behind(client: Client, rt: Runtime) -> None:
    """The running turn ended and its hook never ran, with a turn waiting behind it: continuing the thread
    starts the waiting turn (its input built from the ended turn's transcript), and a `reject` then meets
    that turn."""
    thread = client.create_thread("thr.chat")
    first = client.continue_thread(thread.thread_id, prompt="one")
    waiting = client.continue_thread(thread.thread_id, prompt="two", multitask="enqueue")
    state = client.get(first.turn_id)
    state.status = TurnStatus.CANCELLED
    assert rt.turns.commit(state)
    with pytest.raises(ThreadBusyError) as busy:
        client.continue_thread(thread.thread_id, prompt="three")
    assert busy.value.running_turn_id == waiting.turn_id
    assert [m.role for m in client.get(waiting.turn_id).messages] == ["user", "user"]
    assert turn_ids(client.get_thread(thread.thread_id)) == [first.turn_id, waiting.turn_id]


# --------------------------------------------------------------------------- TTLs and tenants


def test_thread_ttl_is_its_own_and_outlives_the_turn_ttl(prefix: str) -> None:
    settings = make_settings(prefix, event_ttl_s=3600, thread_ttl_s=7 * 24 * 3600)
    from celery.contrib.testing.worker import start_worker

    from stepq.fleet.protocol import worker_queues
    from stepq.workers.app import create_app

    with (
        Client(settings) as client,
        start_worker(
            create_app(settings),
            pool="threads",
            concurrency=2,
            perform_ping_check=False,
            queues=worker_queues(settings),
        ),
    ):
        thread = client.create_thread("thr.chat")
        handle = client.continue_thread(thread.thread_id, prompt="hello")
        handle.wait(timeout=WAIT_S)
        rt = client.runtime
        keys = rt.keys
        eventually(lambda: client.get_thread(thread.thread_id).running_turn_id is None, what="the thread to idle")
        turn_ttl = rt.redis.ttl(keys.turn(handle.turn_id))
        assert 0 < turn_ttl <= 3600
        for key in (
            keys.thread(thread.thread_id),
            keys.thread_messages(thread.thread_id),
            keys.thread_turns(thread.thread_id),
        ):
            assert 3600 < rt.redis.ttl(key) <= 7 * 24 * 3600, key


def test_default_thread_ttl_is_thirty_days() -> None:
    assert Settings.model_fields["thread_ttl_s"].default == 30 * 24 * 3600


def test_another_tenants_thread_is_not_found(client: Client) -> None:
    thread = client.create_thread("thr.chat", tenant="acme")
    assert client.get_thread(thread.thread_id, tenant="acme").tenant == "acme"
    with pytest.raises(ThreadNotFoundError) as unknown:
        client.get_thread("thr_0000", tenant="globex")
    with pytest.raises(ThreadNotFoundError) as other:
        client.get_thread(thread.thread_id, tenant="globex")
    assert str(other.value).replace(thread.thread_id, "X") == str(unknown.value).replace("thr_0000", "X")
    with pytest.raises(ThreadNotFoundError):
        client.continue_thread(thread.thread_id, prompt="hi", tenant="globex")
    assert client.get_thread(thread.thread_id).turns == []


def test_turns_of_a_thread_record_its_tenant_and_id(client: Client) -> None:
    thread = client.create_thread("thr.chat", tenant="acme", metadata={"user": "u1"})
    handle = client.continue_thread(thread.thread_id, prompt="hi", tenant="acme")
    meta: dict[str, Any] = handle.get().metadata
    assert meta == {"user": "u1", "tenant": "acme", "thread_id": thread.thread_id}
    assert handle.get().thread_id == thread.thread_id


# --------------------------------------------------------------------------- over HTTP (real uvicorn)


@pytest.fixture
def served(prefix: str) -> Any:
    support = pytest.importorskip("tests.gateway_support")
    settings = make_settings(prefix, api_keys=support.api_keys_setting(), gateway_rate_limit_rpm=0)
    with support.serve(settings) as served:
        yield served


def _finish_of(served: Any, http: Any, events_url: str) -> dict[str, Any]:
    """Follow a turn's SSE stream to its end, then read the turn: its status and result."""
    from tests.gateway_support import sse_events

    with http.stream("GET", events_url) as response:
        assert response.status_code == 200, response.read()
        events = list(sse_events(response))
    assert events[-1].event == "turn-finish"
    turn = http.get(events_url.removesuffix("/events"))
    assert turn.status_code == 200, turn.text
    data: dict[str, Any] = {"status": turn.json()["status"], **turn.json()["result"]}
    return data


def test_http_thread_conversation_and_its_transcript(served: Any, worker: object) -> None:
    with served.client("k-acme-all") as http:
        created = http.post("/v1/threads", json={"agent": "thr.chat", "metadata": {"user": "u1"}})
        assert created.status_code == 201, created.text
        thread_id = created.json()["thread_id"]
        assert created.json()["agent"] == "thr.chat"

        first = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "hi, I am Ada"})
        assert first.status_code == 201, first.text
        body = first.json()
        assert body["status"] == "queued" and body["events_url"] == f"/v1/turns/{body['turn_id']}/events"
        assert saw(_finish_of(served, http, body["events_url"])["text"]) == "saw: user:hi, I am Ada"

        second = http.post(
            f"/v1/threads/{thread_id}/turns", json={"messages": [{"role": "user", "content": "weather in Oslo?"}]}
        )
        assert second.status_code == 201, second.text
        text = _finish_of(served, http, second.json()["events_url"])["text"]
        assert saw(text).startswith("saw: user:hi, I am Ada | assistant:nice to meet you | user:weather in Oslo?")

        turn = http.get(f"/v1/turns/{second.json()['turn_id']}")  # a thread's turn is a turn of the same tenant
        assert turn.status_code == 200 and turn.json()["metadata"]["thread_id"] == thread_id

        eventually(lambda: http.get(f"/v1/threads/{thread_id}").json()["running_turn_id"] is None, what="idle")
        read = http.get(f"/v1/threads/{thread_id}")
        assert read.status_code == 200
        thread = read.json()
        assert "tenant" not in thread and thread["metadata"] == {"user": "u1"}
        assert [t["status"] for t in thread["turns"]] == ["completed", "completed"]
        assert [m["role"] for m in thread["messages"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]


def test_http_double_texting(served: Any, worker: object, prefix: str, gate: Gate) -> None:
    with served.client("k-acme-all") as http:
        thread_id = http.post("/v1/threads", json={"agent": "thr.gated", "metadata": {"prefix": prefix}}).json()[
            "thread_id"
        ]
        running = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "one"}).json()
        gate.wait_entered()
        busy = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "two"})
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "thread-busy"
        assert running["turn_id"] in busy.json()["error"]["message"]

        queued = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "two", "multitask": "enqueue"})
        assert queued.status_code == 201 and queued.json()["status"] == "waiting"
        urgent = http.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "three", "multitask": "interrupt"})
        assert urgent.status_code == 201 and urgent.json()["status"] == "waiting"
        gate.open()
        assert _finish_of(served, http, running["events_url"])["status"] == "cancelled"
        assert _finish_of(served, http, urgent.json()["events_url"])["status"] == "completed"
        last = _finish_of(served, http, queued.json()["events_url"])
        assert saw(last["text"]).endswith("| user:three | assistant:through the gate | user:two")


def test_http_threads_are_tenant_scoped_and_need_their_scopes(served: Any) -> None:
    with served.client("k-acme-all") as acme, served.client("k-globex-all") as globex:
        thread_id = acme.post("/v1/threads", json={"agent": "thr.chat"}).json()["thread_id"]
        unknown = globex.get("/v1/threads/thr_0123")
        for response in (
            globex.get(f"/v1/threads/{thread_id}"),
            globex.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "hi"}),
        ):
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "not-found"
            assert response.json()["error"]["message"].replace(thread_id, "X") == unknown.json()["error"][
                "message"
            ].replace("thr_0123", "X")
        assert acme.get(f"/v1/threads/{thread_id}").json()["turns"] == []  # globex stored nothing

    with served.client("k-acme-read") as reader, served.client(None) as anonymous:
        assert reader.get(f"/v1/threads/{thread_id}").status_code == 200
        refused = reader.post(f"/v1/threads/{thread_id}/turns", json={"prompt": "hi"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        assert reader.post("/v1/threads", json={"agent": "thr.chat"}).status_code == 403
        assert anonymous.get(f"/v1/threads/{thread_id}").status_code == 401


def test_http_thread_input_errors(served: Any) -> None:
    with served.client("k-acme-all") as http:
        unknown_agent = http.post("/v1/threads", json={"agent": "thr.nope"})
        assert unknown_agent.status_code == 400 and "unknown agent" in unknown_agent.json()["error"]["message"]
        thread_id = http.post("/v1/threads", json={"agent": "thr.chat"}).json()["thread_id"]
        cases = {
            "neither": ({}, 400, "exactly one of prompt"),
            "policy": ({"prompt": "x", "multitask": "rollback"}, 422, "multitask"),
            "extra": ({"prompt": "x", "agent": "thr.chat"}, 422, "agent"),
            "system": ({"messages": [{"role": "system", "content": "x"}]}, 400, "system messages"),
        }
        for name, (body, status, fragment) in cases.items():
            response = http.post(f"/v1/threads/{thread_id}/turns", json=body)
            assert response.status_code == status, (name, response.text)
            assert fragment in response.json()["error"]["message"], (name, response.text)
        assert http.get(f"/v1/threads/{thread_id}").json()["turns"] == []
