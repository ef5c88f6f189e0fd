"""Outages are waited out: a Redis restart, a broker restart and a Redis pause with steps in flight, on
both brokers. Real worker processes, a private redis-server (restarted for real) and RabbitMQ through a
proxy that drops every connection. All turns complete, no worker exits, no client call raises."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kombu import Connection

from stepq.config.settings import Settings
from stepq.models import EventType, TurnStatus
from tests.conftest import AMQP_URL, WorkerProcess, amqp_available, eventually, make_settings
from tests.outage_helpers import RedisServer, TcpProxy

TURNS = 4
LOG_DIR = Path(tempfile.gettempdir()) / "stepq-outage-logs"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    yield srv
    srv.close()


@pytest.fixture
def amqp_proxy() -> Iterator[TcpProxy]:
    if not amqp_available():
        pytest.skip("RabbitMQ is not reachable on 127.0.0.1:5672")
    parsed = urllib.parse.urlsplit(AMQP_URL)
    proxy = TcpProxy(parsed.hostname or "127.0.0.1", parsed.port or 5672)
    yield proxy
    proxy.close()


def _proxied_amqp(proxy: TcpProxy) -> str:
    parsed = urllib.parse.urlsplit(AMQP_URL)
    netloc = parsed.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))


def _delete_amqp_queues(settings: Settings) -> None:
    with Connection(AMQP_URL) as conn:
        channel = conn.channel()
        for name in (settings.queue, f"{settings.queue}.batch"):
            with contextlib.suppress(Exception):
                channel.queue_delete(name)
                channel.exchange_delete(name)


def _through_outage(settings: Settings, prefix: str, tmp_path: Path, outage: Callable[[], None]) -> None:
    """Submit TURNS streaming turns to two worker processes; once steps are in flight, cause the outage;
    every turn completes and both workers are still the same running processes."""
    from stepq.producer.client import Client

    client = Client(settings)
    LOG_DIR.mkdir(exist_ok=True)  # kept when a test fails (pytest's tmp dirs rotate under parallel runs)
    logs = [str(LOG_DIR / f"{prefix}-w{i}.log") for i in (1, 2)]
    # named per test: two of these on one RabbitMQ at once would otherwise fight over one pidbox queue
    workers = [WorkerProcess(settings, f"o{i}-{prefix}", log_path=logs[i - 1]) for i in (1, 2)]
    try:
        handles = [client.submit("rt.slow_stream", prompt="go", metadata={"prefix": prefix}) for _ in range(TURNS)]
        for event in handles[0].events(idle_timeout=120):  # a step is streaming: steps are in flight
            if event.type == EventType.TEXT_DELTA and event.step == 1:
                break
        outage()
        results = [h.wait(timeout=300) for h in handles]
        exited = [(w.name, w.proc.poll()) for w in workers if w.proc.poll() is not None]
    finally:
        for w in workers:
            w.stop()
    details = "\n".join(Path(p).read_text(errors="replace")[-3000:] for p in logs)
    assert not exited, f"worker processes exited during the outage: {exited}\n{details}"
    for result in results:
        assert result.status == TurnStatus.COMPLETED, f"{result.error}\n{details}"
        assert result.text == "x" * 40
    for handle in handles:  # every stream is whole: seqs without gaps, each step's text in full
        events = list(handle.events())
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == EventType.TURN_FINISH
    for path in logs:
        Path(path).unlink(missing_ok=True)


def test_redis_restart_with_steps_in_flight_redis_broker(server: RedisServer, prefix: str, tmp_path: Path) -> None:
    settings = make_settings(prefix, redis_url=server.url, lease_ttl_s=5.0)
    _through_outage(settings, prefix, tmp_path, server.restart)


def test_redis_and_broker_restart_with_steps_in_flight_rabbitmq_broker(
    server: RedisServer, amqp_proxy: TcpProxy, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(prefix, redis_url=server.url, broker_url=_proxied_amqp(amqp_proxy), lease_ttl_s=5.0)

    def outage() -> None:
        amqp_proxy.restart()  # the broker drops every connection...
        server.restart()  # ...and so does Redis

    try:
        _through_outage(settings, prefix, tmp_path, outage)
    finally:
        _delete_amqp_queues(settings)


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_client_pause_mid_load_fails_nothing(
    broker: str, server: RedisServer, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`CLIENT PAUSE 5000 ALL` while turns stream and clients wait: socket timeouts shorter than the pause
    make every Redis call time out and retry; no turn fails and no client call raises."""
    overrides: dict[str, object] = {"redis_url": server.url, "lease_ttl_s": 10.0, "redis_socket_timeout_s": 1.0}
    if broker == "rabbitmq":
        if not amqp_available():
            pytest.skip("RabbitMQ is not reachable on 127.0.0.1:5672")
        overrides["broker_url"] = AMQP_URL
    settings = make_settings(prefix, **overrides)
    errors: list[BaseException] = []
    stop = threading.Event()

    def pause() -> None:
        from stepq.producer.client import Client

        client = Client(settings)

        def poll() -> None:  # client reads issued during the pause
            while not stop.is_set():
                try:
                    list(client.runtime.turns.indexes.due("active", 0))
                    client.get(handle_ids[0])
                except BaseException as exc:
                    errors.append(exc)
                    return

        poller = threading.Thread(target=poll, daemon=True)
        server.pause(5000)
        poller.start()

    handle_ids: list[str] = []
    try:
        from stepq.producer.client import Client

        seed = Client(settings)
        first = seed.submit("rt.basic", prompt="warm up")
        handle_ids.append(first.turn_id)
        _through_outage(settings, prefix, tmp_path, pause)
    finally:
        stop.set()
        if broker == "rabbitmq":
            _delete_amqp_queues(settings)
    assert not errors, errors


def test_a_step_message_stranded_by_an_outage_is_sent_again_at_the_next_sweep(server: RedisServer, prefix: str) -> None:
    """A Redis restart can strand a step's message (popped by kombu but lost with the reply, or reserved by
    a consumer whose connection died). Here a turn is stored and its message never arrives; once the
    worker's consumer has reconnected, the sweeper sends it again at its next tick, although the queued
    grace period (which would otherwise be the only rescue) is an hour."""
    from stepq.producer.client import Client
    from stepq.turns.submit import create_turn

    settings = make_settings(prefix, redis_url=server.url, queued_grace_s=3600.0)
    client = Client(settings)
    LOG_DIR.mkdir(exist_ok=True)
    log = LOG_DIR / f"{prefix}-stranded.log"
    worker = WorkerProcess(settings, "stranded", log_path=str(log))
    try:
        warm = client.submit("rt.basic", prompt="warm up").wait(timeout=120)  # the consumer is connected
        assert warm.status == TurnStatus.COMPLETED
        stranded, _ = create_turn(client.runtime, "rt.basic", prompt="stranded")  # its message never arrives
        server.restart()
        result = client.wait(stranded.turn_id, timeout=120)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
    details = log.read_text(errors="replace")[-3000:]
    assert result.status == TurnStatus.COMPLETED, details
    assert "broker connection re-established" in details
    log.unlink(missing_ok=True)


_RESTORE_AFTER_COLLECT = """
import sys
from kombu import Connection, Consumer, Queue
if sys.argv[3] == "fixed":
    from stepq.workers import kombu_fixes
    kombu_fixes.install()
conn = Connection(sys.argv[1], transport_options={"global_keyprefix": sys.argv[2]})
queue = Queue("restore-check")
with conn.Producer() as producer:
    producer.publish({"n": 1}, routing_key="restore-check", declare=[queue])
channel = conn.channel()
got = []
Consumer(channel, [queue], callbacks=[lambda body, message: got.append(body)]).consume()
conn.drain_events(timeout=10)
assert got == [{"n": 1}]
conn.transport.client = None  # what Connection.collect() does after the broker connection is lost
try:
    channel.close()  # restores the unacknowledged message
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(0)
again = Connection(sys.argv[1], transport_options={"global_keyprefix": sys.argv[2]})
back = again.SimpleQueue("restore-check").get(timeout=10)
print("restored", back.payload)
"""


@pytest.mark.parametrize("mode", ["plain", "fixed"])
def test_restoring_unacked_messages_after_the_connection_is_collected(mode: str, prefix: str) -> None:
    """The installed kombu crashes restoring a collected connection's unacked message (what killed workers
    when Redis went away); with stepq's workaround (installed by every worker app) the message is restored."""
    import subprocess
    import sys

    from tests.conftest import REDIS_URL, ROOT

    done = subprocess.run(
        [sys.executable, "-c", _RESTORE_AFTER_COLLECT, REDIS_URL, f"{prefix}:", mode],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    if mode == "plain":
        assert "AttributeError: 'NoneType' object has no attribute 'hostname'" in done.stdout
    else:
        assert done.stdout.strip() == "restored {'n': 1}"


def test_outage_longer_than_the_window_fails_no_turn(server: RedisServer, prefix: str) -> None:
    """Redis down for longer than STEPQ_REDIS_OUTAGE_S mid-stream: a client call raises our own error; the
    step gives up without failing the turn (never "provider error after content"); once Redis is back
    the sweeper re-runs the step and the turn completes."""
    from stepq.errors import StoreUnavailableError
    from stepq.producer.client import Client

    settings = make_settings(prefix, redis_url=server.url, redis_outage_s=1.0, redis_socket_timeout_s=0.5)
    client = Client(settings)
    LOG_DIR.mkdir(exist_ok=True)
    log = LOG_DIR / f"{prefix}-long.log"
    worker = WorkerProcess(settings, "long", log_path=str(log))
    try:
        handle = client.submit("rt.slow_stream", prompt="go", metadata={"prefix": prefix})
        for event in handle.events(idle_timeout=120):
            if event.type == EventType.TEXT_DELTA and event.step == 1:
                break
        server.stop(save=True)
        with pytest.raises(StoreUnavailableError, match="STEPQ_REDIS_OUTAGE_S"):
            client.get(handle.turn_id)
        # the streaming step gave up on Redis: the worker logs the store error and keeps running
        eventually(lambda: "StoreUnavailableError" in log.read_text(errors="replace"), timeout=120, what="give-up")
        assert worker.proc.poll() is None
        server.start()
        result = handle.wait(timeout=240)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
    details = log.read_text(errors="replace")[-3000:]
    assert result.status == TurnStatus.COMPLETED, f"{result.error}\n{details}"
    assert result.text == "x" * 40
    events = list(handle.events())
    assert not [e for e in events if e.type == EventType.ERROR], details
    assert (EventType.STEP_RESET, 1) in [(e.type, e.step) for e in events]  # the re-run dropped the partial step
    log.unlink(missing_ok=True)
