"""A Redis that never answered is an error shown at once, in every process; one that answered before is
waited out through an outage (STEPQ_REDIS_OUTAGE_S).

STEPQ_REDIS_OUTAGE_S is (nearly) forever in these tests: a process can fail only because it gave up on a Redis
it never reached, not because the window ran out (the subprocess's own timeout would fail the test instead).
Real processes: a `Client` in a fresh interpreter, `stepq worker`, `stepq serve`; a private redis-server for
the outage a `Client` rides out.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
import redis

from stepq.errors import StoreUnavailableError, TurnNotFoundError
from tests.conftest import REDIS_URL, ROOT, make_settings, settings_env
from tests.gateway_support import api_keys_setting
from tests.outage_helpers import RedisServer
from tests.test_cli import TIMEOUT
from tests.test_cli_errors import PASSWORD, assert_one_line_failure, closed_port, embedded_env, run

FOREVER_S = "1000000000"

# Every public Client method against a Redis that never answered: each must raise a StepqError (never redis-py's
# own error), in one line naming the URL without its password.
EVERY_METHOD = textwrap.dedent(
    """
    import sys
    from stepq import Client, StepqError
    from stepq.config.settings import Settings

    client = Client(Settings(redis_url=sys.argv[1], redis_outage_s=float(sys.argv[2]),
                             agent_modules=["stepq.agents.demo"]))
    calls = {
        "submit": lambda: client.submit("demo.support", prompt="hi"),
        "submit_batch": lambda: client.submit_batch("demo.support", [{"key": "a", "prompt": "hi"}]),
        "get": lambda: client.get("turn_0123456789abcdef"),
        "events": lambda: list(client.events("turn_0123456789abcdef")),
        "wait": lambda: client.wait("turn_0123456789abcdef", timeout=5),
        "cancel": lambda: client.cancel("turn_0123456789abcdef"),
        "resume": lambda: client.resume("turn_0123456789abcdef", {"call_1": "ok"}),
        "create_thread": lambda: client.create_thread("demo.support"),
        "get_thread": lambda: client.get_thread("thr_0123456789abcdef"),
        "continue_thread": lambda: client.continue_thread("thr_0123456789abcdef", prompt="hi"),
        "approve": lambda: client.approve("apr_0123456789abcdef", True),
    }
    for name, call in calls.items():
        try:
            call()
        except StepqError as exc:
            print(f"{name}\\t{type(exc).__name__}\\t{exc}", flush=True)
        except Exception as exc:
            print(f"{name}\\tNOT-A-STEPQ-ERROR {type(exc).__name__}\\t{exc}", flush=True)
        else:
            print(f"{name}\\tNO-ERROR\\t", flush=True)
    """
)


@pytest.mark.parametrize("outage_s", [FOREVER_S, "0"], ids=["long-window", "no-window"])
def test_every_client_method_on_a_redis_never_reached_raises_store_unavailable_at_once(outage_s: str) -> None:
    """With a long window the call must give up on its own; with none, it must still raise our error."""
    port = closed_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    proc = subprocess.run(
        [sys.executable, "-c", EVERY_METHOD, url, outage_s],
        env=embedded_env(PYTHONPATH=str(ROOT)), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [row[0] for row in rows] == [
        "submit", "submit_batch", "get", "events", "wait", "cancel", "resume",
        "create_thread", "get_thread", "continue_thread", "approve",
    ]  # fmt: skip
    for name, kind, message in rows:
        assert kind == "StoreUnavailableError", (name, kind, message)
        assert message.startswith(f"cannot reach Redis at redis://:***@127.0.0.1:{port}/0"), (name, message)
        assert "STEPQ_REDIS_URL" in message and PASSWORD not in message


def test_stepq_worker_with_a_redis_never_reached_exits_with_one_line() -> None:
    port = closed_port()
    env = embedded_env(
        STEPQ_REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
        STEPQ_REDIS_OUTAGE_S=FOREVER_S,
        STEPQ_AGENT_MODULES="stepq.agents.demo",
        STEPQ_KEY_PREFIX="first-contact-worker",
    )
    proc = run(env, "worker", "--pool", "threads", "--concurrency", "1")
    assert_one_line_failure(proc, "cannot reach Redis at redis://:***@", str(port), "STEPQ_REDIS_URL")
    assert PASSWORD not in proc.stderr + proc.stdout


def test_stepq_serve_with_a_redis_never_reached_exits_with_one_line(prefix: str) -> None:
    port = closed_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    settings = make_settings(prefix, redis_url=url, redis_outage_s=float(FOREVER_S), api_keys=api_keys_setting())
    proc = run(settings_env(settings), "serve", "--port", "0")
    assert_one_line_failure(proc, "cannot reach Redis at redis://:***@", str(port), "STEPQ_REDIS_URL")
    assert PASSWORD not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "argv",
    [["status"], ["worker", "--pool", "threads", "--concurrency", "1"], ["serve", "--port", "0"]],
    ids=lambda a: a[0],
)
def test_a_database_the_redis_server_does_not_have_is_one_line_naming_the_url(prefix: str, argv: list[str]) -> None:
    """Redis answers, but refuses the connection's SELECT: a setting to fix (exit 2), not "a bug in stepq"."""
    with redis.Redis.from_url(REDIS_URL) as server:
        databases = int(server.config_get("databases")["databases"])
    url = REDIS_URL.rsplit("/", 1)[0] + f"/{databases}"  # the first index past the server's last database
    settings = make_settings(prefix, redis_url=url, api_keys=api_keys_setting())
    line = assert_one_line_failure(run(settings_env(settings), *argv), "STEPQ_REDIS_URL: Redis refused stepq's first")
    assert line.endswith("DB index is out of range (the database number in the URL is past the server's `databases`)")
    assert line.startswith("error: " if argv[0] == "worker" else "stepq: error: "), line


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    yield srv
    srv.close()


def test_a_redis_that_answered_is_waited_out_past_the_first_contact_limit(server: RedisServer, prefix: str) -> None:
    """Once Redis answered, a call rides out an outage longer than FIRST_CONTACT_S: Redis itself holds every
    command for the pause (CLIENT PAUSE), and the call still returns its answer afterwards."""
    from stepq.producer.client import Client
    from stepq.store.connection import FIRST_CONTACT_S

    settings = make_settings(prefix, redis_url=server.url, redis_outage_s=600.0, redis_socket_timeout_s=0.5)
    client = Client(settings)
    with pytest.raises(TurnNotFoundError):
        client.get("turn_0123456789abcdef")  # Redis answered: this process has reached it
    outcome: list[BaseException | None] = []
    started = threading.Event()

    def call_during_the_pause() -> None:
        started.set()
        try:
            client.get("turn_0123456789abcdef")
        except BaseException as exc:  # reported to the test's thread
            outcome.append(exc)

    server.pause(int(FIRST_CONTACT_S * 3 * 1000))
    caller = threading.Thread(target=call_during_the_pause)
    caller.start()
    assert started.wait(TIMEOUT)
    caller.join(TIMEOUT)
    assert not caller.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], TurnNotFoundError), outcome
    assert not isinstance(outcome[0], StoreUnavailableError)


def test_a_broker_that_refuses_the_send_is_a_stepq_error_and_the_turn_stays_stored(prefix: str) -> None:
    """Redis answers but the broker does not: submit raises BrokerUnavailableError (never kombu's own error) in
    one line naming the broker without its password, and the turn it stored waits as queued for the sweeper."""
    from stepq.errors import BrokerUnavailableError
    from stepq.models import TurnStatus
    from stepq.producer.client import Client

    port = closed_port()
    settings = make_settings(prefix, broker_url=f"amqp://guest:{PASSWORD}@127.0.0.1:{port}//")
    with Client(settings) as client:
        with pytest.raises(BrokerUnavailableError) as caught:
            client.submit("rt.basic", prompt="hi")
        message = str(caught.value)
        assert message.startswith(f"cannot reach the broker at amqp://guest:***@127.0.0.1:{port}//"), message
        assert "STEPQ_BROKER_URL" in message and "\n" not in message and PASSWORD not in message
        stored = re.compile(rf"^{re.escape(prefix)}:turn:\{{[^}}]+\}}:(turn_\w+)$")
        keys = [k.decode() if isinstance(k, bytes) else k for k in client.runtime.redis.scan_iter(f"{prefix}:turn:*")]
        [turn_id] = [m.group(1) for m in map(stored.match, keys) if m]
        assert client.get(turn_id).status == TurnStatus.QUEUED
