"""Inline steps: a step that ends with its turn's next step runs that step in the same Celery task while
nothing else waits for the worker (`STEPQ_INLINE_STEPS`), and hands it to the broker when an interactive
step waits, past the inline budget, or when the worker shuts down. Each step still commits on its own."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from celery.signals import task_prerun

from stepq.fleet.protocol import RUN_STEP, worker_queues
from stepq.models import TurnStatus
from stepq.producer.client import Client
from stepq.workers import tasks
from stepq.workers.app import create_app
from tests.agents_inline import TOOL_STEPS, entered_key, open_key
from tests.conftest import AMQP_URL, REDIS_URL, WorkerProcess, amqp_available, make_settings

STEPS = TOOL_STEPS + 1  # inline.loop: its tool steps, then the answer


@contextlib.contextmanager
def run_step_tasks() -> Iterator[list[tuple[str, int]]]:
    """The (turn id, step) of each run_step task the in-process worker starts while the block runs, in order."""
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def record(sender=None, args=None, **_: object) -> None:
        if sender is not None and sender.name == RUN_STEP and args:
            with lock:
                seen.append((args[0], args[1]))

    task_prerun.connect(record, weak=False)
    try:
        yield seen
    finally:
        task_prerun.disconnect(record)


@contextlib.contextmanager
def in_process_worker(settings, concurrency: int) -> Iterator[None]:
    app = create_app(settings)
    with start_worker(
        app, pool="threads", concurrency=concurrency, perform_ping_check=False, loglevel="WARNING",
        queues=worker_queues(settings),
    ):  # fmt: skip
        yield


def _loop_turn(client: Client, prefix: str) -> str:
    handle = client.submit("inline.loop", prompt="go", metadata={"prefix": prefix})
    result = handle.wait(timeout=120)
    assert result.status == TurnStatus.COMPLETED, result.error
    assert len(result.trace.steps) == STEPS
    return handle.turn_id


@pytest.mark.parametrize(
    "broker",
    ["redis", pytest.param("rabbitmq", marks=pytest.mark.skipif(not amqp_available(), reason="no RabbitMQ"))],
)
def test_a_turns_next_steps_run_in_its_first_steps_task_when_nothing_waits(broker, prefix, monkeypatch):
    monkeypatch.setattr(tasks, "INLINE_BUDGET_S", 120.0)  # a loaded machine must not run past the budget here
    settings = make_settings(prefix, **({"broker_url": AMQP_URL} if broker == "rabbitmq" else {}))
    client = Client(settings)
    with in_process_worker(settings, concurrency=2), run_step_tasks() as seen:
        turn_id = _loop_turn(client, prefix)
    assert [s for s in seen if s[0] == turn_id] == [(turn_id, 0)]  # one task ran all of the turn's steps
    assert client.runtime.turns.sent_step(turn_id) == 0  # and only step 0 went through the broker


def test_with_inline_steps_off_every_step_is_its_own_task(prefix):
    settings = make_settings(prefix, inline_steps=False)
    client = Client(settings)
    with in_process_worker(settings, concurrency=2), run_step_tasks() as seen:
        turn_id = _loop_turn(client, prefix)
    assert [s for s in seen if s[0] == turn_id] == [(turn_id, step) for step in range(STEPS)]
    assert client.runtime.turns.sent_step(turn_id) == STEPS - 1


def test_past_the_inline_budget_the_next_step_goes_through_the_broker(settings, client, prefix, monkeypatch):
    monkeypatch.setattr(tasks, "INLINE_BUDGET_S", -1.0)  # always past it
    with in_process_worker(settings, concurrency=2), run_step_tasks() as seen:
        turn_id = _loop_turn(client, prefix)
    assert [s for s in seen if s[0] == turn_id] == [(turn_id, step) for step in range(STEPS)]


def test_a_waiting_interactive_step_takes_the_worker_before_the_turns_next_step(settings, client, prefix, monkeypatch):
    """One worker thread, busy in turn A's step 0 while turn B's first step waits in the broker: A's next step
    is handed to the broker (behind B's), not run inline."""
    monkeypatch.setattr(tasks, "INLINE_BUDGET_S", 120.0)
    monkeypatch.setattr(tasks, "INLINE_CHECK_S", 0.0)  # look at the broker before every inline step
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=90)  # outlasts the BLPOPs
    with in_process_worker(settings, concurrency=1), run_step_tasks() as seen:
        a = client.submit("inline.gated", prompt="go", metadata={"prefix": prefix})
        assert r.blpop([entered_key(prefix, "a")], timeout=60) is not None  # A's step 0 holds the only thread
        b = client.submit("inline.loop", prompt="go", metadata={"prefix": prefix})  # its step 0 waits in the broker
        r.rpush(open_key(prefix, "a"), "1")
        assert a.wait(timeout=120).status == TurnStatus.COMPLETED
        assert b.wait(timeout=120).status == TurnStatus.COMPLETED
    assert seen.count((a.turn_id, 1)) == 1  # A's step 1 was a task of its own
    assert seen.index((b.turn_id, 0)) < seen.index((a.turn_id, 1))  # and it ran after B's waiting step


def test_a_worker_shutting_down_hands_the_next_step_to_the_broker(prefix):
    """SIGTERM (warm shutdown) while step 0 runs: the step finishes and commits, and the next one is sent to the
    broker rather than run by a worker on its way out; another worker then finishes the turn."""
    settings = make_settings(prefix)
    client = Client(settings)
    rt = client.runtime
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=90)  # outlasts the BLPOPs
    worker = WorkerProcess(settings, "leaving", beat=False, concurrency=1)
    try:
        handle = client.submit("inline.gated", prompt="go", metadata={"prefix": prefix})
        assert r.blpop([entered_key(prefix, "a")], timeout=60) is not None
        os.kill(worker.proc.pid, signal.SIGTERM)  # the worker's main process: a warm shutdown
        r.rpush(open_key(prefix, "a"), "1")
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.stop()
    state = rt.turns.load(handle.turn_id)
    assert state is not None and not state.status.terminal and state.step == 1  # step 0 committed, no more
    assert rt.turns.sent_step(handle.turn_id) == 1  # its next step waits in the broker
    successor = WorkerProcess(settings, "successor", beat=False, concurrency=1)
    try:
        assert handle.wait(timeout=120).status == TurnStatus.COMPLETED
    finally:
        successor.stop()


@pytest.mark.parametrize("flag", ["should_stop", "should_terminate"])
def test_the_shutdown_flag_counts_when_it_is_exit_code_zero(flag, monkeypatch):
    """Celery sets the flag to the exit code, and a clean warm shutdown's is 0: still a shutdown."""
    assert not tasks._shutting_down()
    monkeypatch.setattr(tasks.worker_state, flag, 0)
    assert tasks._shutting_down()
