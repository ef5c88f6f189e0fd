"""A submit on a Redis broker that is the store's own Redis: the create script pushes the turn's first message.

The message is Celery's own, taken at kombu's Redis transport instead of sent (stepq.fleet.broker_capture): one
round trip for the whole submit, a repeated idempotency key pushes nothing, and a broker elsewhere (another
database, RabbitMQ) gets its message sent by Celery as before. A client's first submit sends the usual way (that
send opens kombu's channel; after it a captured send does no I/O, so an outage is the store's to report).
Counted at the socket, for every redis-py connection of the submitting thread (the store's and kombu's), on the
real local Redis.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from stepq.config.settings import Settings
from stepq.errors import StoreUnavailableError, ThreadBusyError
from stepq.fleet.protocol import RUN_STEP, run_step_message, send_options, worker_queues
from stepq.models import EventType, TurnStatus
from stepq.producer.client import Client
from stepq.store.keys import Keys
from tests.conftest import AMQP_URL, REDIS_URL, make_settings
from tests.outage_helpers import RedisServer
from tests.test_step_costs import _commands


def _names(packed: Any) -> list[str]:
    """The command names in what redis-py writes to a socket."""
    return [args[0].decode().upper() for args in _commands(packed)]


@contextmanager
def trips_of_this_thread() -> Iterator[list[list[str]]]:
    """Every request any redis-py connection writes from this thread (one per round trip), by command names."""
    trips: list[list[str]] = []
    me = threading.current_thread()
    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        if threading.current_thread() is me:
            names = _names(command)
            if names not in (["PING"], ["HELLO"]) and names[:1] != ["CLIENT"]:  # a connection's own handshake
                trips.append(names)
        original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    try:
        yield trips
    finally:
        redis.connection.AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def _queued(settings: Settings, url: str = REDIS_URL) -> list[dict[str, Any]]:
    """The run_step messages waiting in the interactive queue of `settings` on the broker at `url`."""
    client = redis.Redis.from_url(url)
    try:
        raw = client.lrange(f"{Keys(settings.key_prefix).broker_prefix}{settings.queue}", 0, -1)
    finally:
        client.close()
    return [json.loads(m) for m in raw]


def _args(message: dict[str, Any]) -> list[Any]:
    args: list[Any] = json.loads(base64.b64decode(message["body"]))[0]
    return args


def warm_client(settings: Settings, prefix: str) -> tuple[Client, str]:
    """A client past its first submit (sent through Celery, which opens kombu's channel); that turn's id."""
    client = Client(settings)
    warm = client.submit("eng.simple", prompt="warm", metadata={"prefix": prefix})
    return client, warm.turn_id


def test_a_submit_is_one_round_trip_that_stores_the_turn_and_pushes_its_first_message(prefix: str) -> None:
    client = Client(make_settings(prefix))
    with trips_of_this_thread() as first_trips:
        warm = client.submit("eng.simple", prompt="warm", metadata={"prefix": prefix})
    assert ["LPUSH"] in first_trips  # the first submit: stored, then sent by Celery
    with trips_of_this_thread() as trips:
        handle = client.submit("eng.simple", prompt="hi", metadata={"prefix": prefix})
    assert trips == [["MULTI", "EVALSHA", "EVALSHA", "EXEC"]]  # no LPUSH of its own: the create script's
    assert [_args(m) for m in reversed(_queued(client.settings))] == [[warm.turn_id, 0], [handle.turn_id, 0]]
    assert client.runtime.turns.load(handle.turn_id) is not None


def test_the_pushed_message_is_the_one_celery_sends(prefix: str) -> None:
    """Same envelope, headers and properties as a message Celery sends itself, ids aside."""
    settings = make_settings(prefix)
    client, warm = warm_client(settings, prefix)
    client.celery.send_task(RUN_STEP, queue=settings.queue, **run_step_message("turn-x", 0))
    handle = client.submit("eng.simple", prompt="hi", metadata={"prefix": prefix})
    pushed, sent, first = _queued(settings)  # LPUSH: newest first
    assert _args(first) == [warm, 0]
    assert _args(pushed) == [handle.turn_id, 0] and _args(sent) == ["turn-x", 0]
    assert pushed.keys() == sent.keys()
    assert pushed["headers"].keys() == sent["headers"].keys()
    assert pushed["headers"]["task"] == sent["headers"]["task"] == RUN_STEP
    ids = {"correlation_id", "delivery_tag", "argsrepr"}
    assert {k: v for k, v in pushed["properties"].items() if k not in ids} == {
        k: v for k, v in sent["properties"].items() if k not in ids
    }


def test_a_repeated_key_pushes_nothing_and_a_keyed_turn_counts_as_sent(prefix: str) -> None:
    client, warm = warm_client(make_settings(prefix), prefix)
    with trips_of_this_thread() as trips:
        first = client.submit("eng.simple", prompt="hi", idempotency_key="k", metadata={"prefix": prefix})
    assert len(trips) == 1  # no send, and no SET of the dispatched marker of its own
    assert not client.runtime.turns.never_dispatched(first.turn_id)  # the script marked it: no resend
    again = client.submit("eng.simple", prompt="hi", idempotency_key="k", metadata={"prefix": prefix})
    assert again.turn_id == first.turn_id and not again.created
    assert [_args(m) for m in _queued(client.settings)] == [[first.turn_id, 0], [warm, 0]]


def test_a_broker_in_another_database_gets_the_message_from_celery(prefix: str) -> None:
    broker = REDIS_URL.rsplit("/", 1)[0] + "/1"
    settings = make_settings(prefix, broker_url=broker)
    try:
        client, warm = warm_client(settings, prefix)
        with trips_of_this_thread() as trips:
            handle = client.submit("eng.simple", prompt="hi", metadata={"prefix": prefix})
        assert trips[0] == ["MULTI", "EVALSHA", "EVALSHA", "EXEC"] and ["LPUSH"] in trips[1:]
        assert _queued(settings) == []  # nothing in the store's database
        assert [_args(m) for m in _queued(settings, broker)] == [[handle.turn_id, 0], [warm, 0]]
    finally:
        other = redis.Redis.from_url(broker)
        for key in other.scan_iter(match=f"{prefix}:*", count=1000):
            other.delete(key)
        other.close()


def test_a_worker_started_after_the_submit_runs_the_turn(prefix: str) -> None:
    """On a Redis broker nothing declares the queue before a worker does (`declare=[]`): the list is enough."""
    from stepq.workers.app import create_app

    settings = make_settings(prefix)
    client, warm = warm_client(settings, prefix)
    handle = client.submit("eng.simple", prompt="hi", metadata={"prefix": prefix})
    app = create_app(settings)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, queues=worker_queues(settings)):
        assert handle.wait(timeout=120).status == TurnStatus.COMPLETED
        assert client.wait(warm, timeout=120).status == TurnStatus.COMPLETED


def test_a_redis_restart_and_an_outage_are_the_stores_to_ride_out_or_report() -> None:
    """After a restart the captured send needs no reconnect (it does no I/O) and the store's call rides the
    restart out; with Redis gone, the submit raises StoreUnavailableError within the store's window and leaves
    nothing: neither the turn nor its message."""
    server = RedisServer()
    try:
        settings = Settings(
            redis_url=server.url, key_prefix="capture-outage", redis_outage_s=1.0, agent_modules=["tests.agents_engine"]
        )
        client = Client(settings)
        client.submit("eng.simple", prompt="warm")
        server.restart()
        after = client.submit("eng.simple", prompt="after the restart")
        assert _args(_queued(settings, server.url)[0])[0] == after.turn_id
        server.stop(save=True)
        with pytest.raises(StoreUnavailableError, match="did not answer for 1 s"):
            client.submit("eng.simple", prompt="while it is down")
        server.start()
        turns = [k for k in server.client().scan_iter(match="capture-outage:turn:*") if k.count(b":") == 3]
        assert len(turns) == 2 and len(_queued(settings, server.url)) == 2
    finally:
        server.close()


def test_only_a_redis_broker_skips_the_declare() -> None:
    assert send_options(make_settings("p")) == {"declare": []}
    assert (
        send_options(make_settings("p", broker_url=AMQP_URL)) == {}
    )  # RabbitMQ drops a message to an undeclared queue


# --------------------------------------------------------------------------- a thread's next turn (the chat path)


def _listed(client: Client, tenant: str = "") -> list[str]:
    return client.runtime.listings.turn_page(tenant, time.time() + 1).ids


def test_a_thread_turn_is_one_write_trip_that_announces_lists_and_pushes(prefix: str) -> None:
    """continue_thread (the AI SDK chat endpoint's path): the thread's one read (nothing to settle when no turn of
    it runs), then one MULTI: the thread's script stores the turn, writes its `turn-start` and pushes its first
    message; the listing rides in the same MULTI."""
    client, _ = warm_client(make_settings(prefix), prefix)
    thread = client.create_thread("eng.simple", metadata={"prefix": prefix})
    with trips_of_this_thread() as trips:
        handle = client.continue_thread(thread.thread_id, prompt="hi")
    assert trips == [
        ["MULTI", "HGETALL", "LRANGE", "LRANGE", "LRANGE", "EXEC"],  # the thread: no turn runs, none to settle
        ["MULTI", "EVALSHA", "EVALSHA", "EXEC"],  # the thread's script and the listing
    ]
    assert _args(_queued(client.settings)[0]) == [handle.turn_id, 0]
    (start,) = client.runtime.events.read(handle.turn_id)
    assert start.type == EventType.TURN_START and start.data["thread_id"] == thread.thread_id
    assert handle.turn_id in _listed(client)


def test_a_refused_or_waiting_thread_turn_pushes_nothing(prefix: str) -> None:
    """Busy under `reject`: nothing stored, announced, listed or pushed. Queued behind the running turn under
    `enqueue`: stored, announced and listed, but its message waits for the running turn's finish."""
    client, _ = warm_client(make_settings(prefix), prefix)
    thread = client.create_thread("eng.simple", metadata={"prefix": prefix})
    running = client.continue_thread(thread.thread_id, prompt="first")  # no worker: it stays the running turn
    queued_before = len(_queued(client.settings))
    with pytest.raises(ThreadBusyError):
        client.continue_thread(thread.thread_id, prompt="refused")
    waiting = client.continue_thread(thread.thread_id, prompt="second", multitask="enqueue")
    assert len(_queued(client.settings)) == queued_before  # neither pushed a message
    assert [e.type for e in client.runtime.events.read(waiting.turn_id)] == [EventType.TURN_START]
    assert {running.turn_id, waiting.turn_id} <= set(_listed(client))
    assert len(_listed(client)) == 3  # the warm-up turn and these two: the refused one was never listed
