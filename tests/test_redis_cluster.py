"""State on a real Redis Cluster: three masters started here on spare ports, a real worker process on the
RabbitMQ broker, a full turn with tools, an approval and streaming, events replayed, the sweeper on the
cluster's indexes, and the gateway's async cluster client reading the same log."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from kombu import Connection
from redis.cluster import ClusterNode, RedisCluster

from stepq.config.settings import Settings
from stepq.errors import ConfigurationError
from stepq.fleet.runtime import get_runtime
from stepq.models import EventType, TurnStatus
from tests.conftest import AMQP_URL, WorkerProcess, amqp_available, eventually, make_settings
from tests.test_durability import _side_effects

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None, reason="redis-server is not installed"
)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port(taken: list[int]) -> int:
    """A port that is free together with its cluster bus port (+10000), so at most 55535."""
    while True:
        port = random.randint(20000, 45000)
        if port not in taken and port + 10000 not in taken and _bindable(port) and _bindable(port + 10000):
            return port


def _answers(port: int, server: subprocess.Popen[bytes]) -> bool:
    if server.poll() is not None:
        raise AssertionError(f"redis-server on port {port} exited with code {server.returncode}")
    try:
        with redis.Redis(port=port, socket_connect_timeout=1) as node:
            return bool(node.ping())
    except redis.ConnectionError:
        return False


def _cluster_ok(ports: list[int]) -> bool:
    for port in ports:
        with redis.Redis(port=port, decode_responses=True) as node:
            if node.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                return False
    return True


def _start_node(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    conf = str(workdir / f"nodes-{port}.conf")
    return subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
         "--cluster-config-file", conf, "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """Three cluster-enabled masters (no replicas, no persistence), joined into one cluster."""
    workdir = Path(tempfile.mkdtemp(prefix="stepq-cluster-"))
    ports: list[int] = []
    for _ in range(3):
        ports.append(_free_port(ports))
    servers = [_start_node(port, workdir) for port in ports]
    try:
        for port, server in zip(ports, servers, strict=True):
            eventually(lambda p=port, s=server: _answers(p, s), timeout=60, what=f"redis-server on port {port}")
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        eventually(lambda: _cluster_ok(ports), timeout=120, what="cluster_state:ok on every node")
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:2])
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def cluster_settings(cluster_url: str, prefix: str) -> Iterator[Settings]:
    settings = make_settings(prefix, redis_url=cluster_url, broker_url=AMQP_URL)
    yield settings
    with Connection(AMQP_URL) as conn:
        channel = conn.channel()
        for name in (settings.queue, f"{settings.queue}.batch"):
            with contextlib.suppress(Exception):
                channel.queue_delete(name)
                channel.exchange_delete(name)


def _slot(settings: Settings, key: str) -> int:
    """The key's slot as the cluster itself computes it (CLUSTER KEYSLOT on a node)."""
    client = get_runtime(settings).redis
    return int(client.execute_command("CLUSTER KEYSLOT", key, target_nodes=RedisCluster.RANDOM))


def _keys_of_turn(settings: Settings, turn_id: str) -> list[str]:
    """Every stored key whose name holds the turn id, read from each master."""
    client = get_runtime(settings).redis
    assert isinstance(client, RedisCluster)
    found: list[str] = []
    for node in client.get_primaries():
        found.extend(client.keys(f"{settings.key_prefix}:*{turn_id}*", target_nodes=node))
    return found


def _node_of(settings: Settings, key: str) -> str:
    """The master that actually holds `key` (asked of every master, not computed)."""
    client = get_runtime(settings).redis
    assert isinstance(client, RedisCluster)
    assert not set("*?[]\\") & set(key)  # the name is its own KEYS pattern
    holders = [node.name for node in client.get_primaries() if client.keys(key, target_nodes=node)]
    assert len(holders) == 1, (key, holders)
    return holders[0]


def _nodes_holding(settings: Settings, pattern: str) -> set[str]:
    """The cluster nodes that hold at least one key matching `pattern`."""
    client = get_runtime(settings).redis
    assert isinstance(client, RedisCluster)
    holders = set()
    for node in client.get_primaries():
        if client.keys(pattern, target_nodes=node):
            holders.add(node.name)
    return holders


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_a_turn_with_tools_an_approval_and_streaming_runs_on_the_cluster(
    cluster_settings: Settings, prefix: str
) -> None:
    from stepq.producer.client import Client

    settings = cluster_settings
    log = Path(tempfile.mkdtemp(prefix="stepq-cluster-log-")) / "worker.log"
    worker = WorkerProcess(settings, "cl1", log_path=str(log))
    try:
        client = Client(settings)
        assert isinstance(client.runtime.redis, RedisCluster)
        handle = client.submit("rt.approver", prompt="go", metadata={"prefix": prefix})
        live = []
        for event in handle.events(idle_timeout=120):
            live.append(event)
            if event.type == EventType.APPROVAL_REQUEST:
                break
        request = live[-1]
        assert request.type == EventType.APPROVAL_REQUEST
        assert any(e.type == EventType.TEXT_DELTA for e in live)  # streamed through cluster pub/sub
        assert any(e.type == EventType.TOOL_RESULT and e.data["name"] == "rt_echo" for e in live)
        eventually(
            lambda: client.get(handle.turn_id).status == TurnStatus.AWAITING_APPROVAL, timeout=120, what="the park"
        )
        assert _side_effects(prefix, handle.turn_id, "gated") == 0

        assert client.approve(request.data["approval_id"], True, reviewer="ops").wait(120)
        result = handle.wait(timeout=120)
        assert result.status == TurnStatus.COMPLETED and result.text == "done"
        assert _side_effects(prefix, handle.turn_id, "gated") == 1

        # the log replays gap-free from the start and from a cursor, after the turn ended
        replay = list(client.events(handle.turn_id, after=0, idle_timeout=120))
        assert [e.seq for e in replay] == list(range(1, len(replay) + 1))
        assert replay[-1].type == EventType.TURN_FINISH
        assert [e.seq for e in live] == [e.seq for e in replay[: len(live)]]
        tail = list(client.events(handle.turn_id, after=request.seq, idle_timeout=120))
        assert tail == replay[request.seq :]
        decisions = [e for e in replay if e.type == EventType.APPROVAL_DECISION]
        assert [d.data["decision"] for d in decisions] == ["approved"]

        # the turn's keys, its approval included, share one slot (every script on them stays in it)
        slots = {_slot(settings, key) for key in _keys_of_turn(settings, handle.turn_id)}
        slots.add(_slot(settings, client.runtime.keys.approval(request.data["approval_id"])))
        assert len(slots) == 1 and len(_keys_of_turn(settings, handle.turn_id)) >= 5
    finally:
        worker.stop()
    text = log.read_text(errors="replace") if log.exists() else ""
    assert "CROSSSLOT" not in text and "Traceback" not in text, text[-4000:]


def test_turns_spread_over_every_master_and_each_turn_keeps_one_slot(cluster_settings: Settings, prefix: str) -> None:
    from stepq.engine.runner import StepRunner
    from stepq.turns.submit import create_turn
    from stepq.turns.threads import continue_thread, create_thread

    rt = get_runtime(cluster_settings)
    client = rt.redis
    assert isinstance(client, RedisCluster)
    masters = {node.name for node in client.get_primaries()}
    assert len(masters) == 3
    turn_ids = [create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})[0].turn_id for _ in range(60)]
    homes = {_node_of(cluster_settings, rt.keys.turn(t)) for t in turn_ids}
    assert homes == masters  # the turns are spread: every master holds some
    for turn_id in turn_ids[:10]:
        keys = _keys_of_turn(cluster_settings, turn_id)
        assert len(keys) >= 4 and len({_slot(cluster_settings, k) for k in keys}) == 1, keys
    # a step commits through its scripts on whichever master holds the turn
    assert StepRunner(rt).deliver(turn_ids[0], 0).action == "next"

    # the sweeper's worklist is sharded: its 16 shards spread over more than one master
    shard_nodes = {_node_of(cluster_settings, rt.keys.active(rt.keys.shard(t))) for t in turn_ids}
    assert len(shard_nodes) >= 2
    assert rt.turns.indexes.count("active") == 60

    # an idempotency key lives in its turn's slot (checking it and storing the turn is one script)
    keyed, created = create_turn(rt, "rt.basic", prompt="go", idempotency_key="k-1", metadata={"prefix": prefix})
    again, created_again = create_turn(rt, "rt.basic", prompt="go", idempotency_key="k-1", metadata={"prefix": prefix})
    assert created and not created_again and again.turn_id == keyed.turn_id
    assert _slot(cluster_settings, rt.keys.idempotency("rt.basic", "k-1")) == _slot(
        cluster_settings, rt.keys.turn(keyed.turn_id)
    )
    # a thread's turns live in its slot; threads spread like turns
    threads = [create_thread(rt, "thr.chat").thread_id for _ in range(30)]
    assert {_node_of(cluster_settings, rt.keys.thread(t)) for t in threads} == masters
    continued = continue_thread(rt, threads[0], prompt="hi")
    assert _slot(cluster_settings, rt.keys.turn(continued.state.turn_id)) == _slot(
        cluster_settings, rt.keys.thread(threads[0])
    )


def test_the_sweeper_works_on_the_cluster_indexes(cluster_settings: Settings, prefix: str) -> None:
    """Turns in every shard, committed but their messages never sent: one sweep finds them all, shard by shard."""
    from stepq.engine.decisions import sweep
    from stepq.engine.runner import StepRunner
    from stepq.turns.submit import create_turn

    rt = get_runtime(cluster_settings)
    turn_ids = []
    for _ in range(24):
        state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
        decision = StepRunner(rt).deliver(state.turn_id, 0)
        assert decision.action == "next" and decision.step == 1  # committed; its message is never sent
        rt.turns.indexes.add("active", state.turn_id, 0)  # as if committed one lease TTL ago
        turn_ids.append(state.turn_id)
    assert len({rt.keys.shard(t) for t in turn_ids}) > 1
    rt.redis.delete(rt.keys.sweep_lock)
    assert sorted(sweep(rt, queued_grace_s=3600)) == sorted((t, 1, "interactive") for t in turn_ids)
    for turn_id in turn_ids:
        rt.turns.mark_sent(turn_id, 1)
        rt.turns.indexes.add("active", turn_id, 0)
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=3600) == []


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_kill_9_during_an_approved_mutation_recovers_on_the_cluster(cluster_url: str, prefix: str) -> None:
    """A worker killed (SIGKILL) while an approved tool runs: the other worker's sweeper finds the step through
    the cluster's sharded worklist and the turn completes, the interrupted tool run again once."""
    from tests.test_recovery import DEFAULTS, _kill_during_approved_mutation

    settings = make_settings(prefix, redis_url=cluster_url, broker_url=AMQP_URL, **DEFAULTS)
    try:
        _kill_during_approved_mutation(settings, prefix)
    finally:
        with Connection(AMQP_URL) as conn:
            channel = conn.channel()
            for name in (settings.queue, f"{settings.queue}.batch"):
                with contextlib.suppress(Exception):
                    channel.queue_delete(name)
                    channel.exchange_delete(name)


def test_the_gateway_reads_events_through_the_async_cluster_client(cluster_settings: Settings, prefix: str) -> None:
    from stepq.producer.gateway.service import _cluster_clients
    from stepq.producer.gateway.streams import EventReader
    from stepq.turns.submit import create_turn

    rt = get_runtime(cluster_settings)
    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix})
    expected = [e.seq for e in rt.events.read(state.turn_id, 0)]
    assert expected

    async def read() -> tuple[list[int], int]:
        commands, pubsub = _cluster_clients(str(cluster_settings.redis_url), 4)
        try:
            reader = EventReader(commands, rt.keys)
            got = [e.seq for e in await reader.read(state.turn_id, 0)]
            owner, last = await reader.owner_and_last_seq(state.turn_id)  # a pipeline through the cluster client
            assert owner is not None and last == expected[-1]
            # a cluster forwards PUBLISH to every node: the gateway's one-node subscriber hears a turn's channel
            sub = pubsub.pubsub()
            await sub.subscribe(rt.keys.channel(state.turn_id))
            await sub.get_message(timeout=10)  # the subscribe confirmation
            rt.redis.publish(rt.keys.channel(state.turn_id), "ping")
            message = None
            with anyio.fail_after(60):
                while message is None:
                    message = await sub.get_message(ignore_subscribe_messages=True, timeout=1)
            await sub.aclose()
            return got, 1 if message["data"] == "ping" else 0
        finally:
            await commands.aclose()
            await pubsub.aclose()

    got, heard = anyio.run(read)
    assert got == expected and heard == 1


def test_a_cluster_is_refused_as_the_broker_in_one_line(cluster_url: str) -> None:
    with pytest.raises(ConfigurationError, match="STEPQ_BROKER_URL=amqp://") as error:
        _ = make_settings("x", redis_url=cluster_url).effective_broker_url
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="cannot use a Redis Cluster as its broker"):
        make_settings("x", broker_url=cluster_url)


def test_the_cluster_client_follows_the_url(cluster_url: str) -> None:
    from stepq.store.connection import parse_cluster_url

    target = parse_cluster_url(cluster_url)
    assert len(target.nodes) == 2
    with pytest.raises(ConfigurationError, match="host:port"):
        parse_cluster_url("redis+cluster://127.0.0.1")
    client = RedisCluster(startup_nodes=[ClusterNode(*target.nodes[0])])
    try:
        assert len(client.get_primaries()) == 3  # the client learned the third master from the first
    finally:
        client.close()


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_the_gateway_streams_a_turn_from_the_cluster_over_sse(cluster_url: str, prefix: str) -> None:
    from tests.gateway_support import api_keys_setting, serve, sse_events, submit

    settings = make_settings(
        prefix, redis_url=cluster_url, broker_url=AMQP_URL, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0
    )
    worker = WorkerProcess(settings, "cl2")
    try:
        with serve(settings) as gw, gw.client() as http:
            turn_id = submit(http, "rt.slow_stream", "go", metadata={"prefix": prefix})
            with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
                seen = list(sse_events(response))
            turn = http.get(f"/v1/turns/{turn_id}").json()
    finally:
        worker.stop()
        with Connection(AMQP_URL) as conn:
            channel = conn.channel()
            for name in (settings.queue, f"{settings.queue}.batch"):
                with contextlib.suppress(Exception):
                    channel.queue_delete(name)
                    channel.exchange_delete(name)
    assert seen[-1].event == "turn-finish"
    assert [e.id for e in seen] == list(range(1, len(seen) + 1))  # every event once, in order
    assert any(e.event == "text-delta" for e in seen)
    assert turn["status"] == "completed" and turn["result"]["text"] == "x" * 40


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_a_thread_carries_its_transcript_across_turns_on_the_cluster(cluster_settings: Settings) -> None:
    from stepq.producer.client import Client
    from tests.test_threads import WAIT_S, saw

    worker = WorkerProcess(cluster_settings, "cl3")
    try:
        client = Client(cluster_settings)
        thread = client.create_thread("thr.chat")
        first = client.continue_thread(thread.thread_id, prompt="hi, I am Ada").wait(timeout=WAIT_S)
        assert first.status == TurnStatus.COMPLETED
        second = client.continue_thread(thread.thread_id, prompt="weather in Oslo?").wait(timeout=WAIT_S)
        assert second.status == TurnStatus.COMPLETED
        assert saw(second.text) == (
            "saw: user:hi, I am Ada | assistant:nice to meet you | user:weather in Oslo? | "
            'assistant:let me look call:thr_weather | tool:thr_weather={"city": "Oslo", "weather": "sunny"}'
        )
        stored = client.get_thread(thread.thread_id)
        assert stored.running_turn_id is None
        assert [t.status for t in stored.turns] == ["completed"] * 2
    finally:
        worker.stop()


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_a_batch_runs_and_resubmits_idempotently_on_the_cluster(cluster_settings: Settings) -> None:
    from stepq.producer.client import Client

    worker = WorkerProcess(cluster_settings, "cl4")
    try:
        client = Client(cluster_settings)
        items = [{"key": f"k{i}", "input": {"text": f"Contact {i} <c{i}@example.com>"}} for i in range(5)]
        batch_id, handles = client.submit_batch("bt.extract", items, key="cluster-batch")
        assert batch_id == "cluster-batch" and all(h.created for h in handles)
        assert all(h.wait(timeout=120).status == TurnStatus.COMPLETED for h in handles)
        _, again = client.submit_batch("bt.extract", items, key="cluster-batch")
        assert [h.turn_id for h in again] == [h.turn_id for h in handles]
        assert not any(h.created for h in again)
    finally:
        worker.stop()


def test_late_list_updates_never_undo_another_processs_on_the_cluster(cluster_settings: Settings, prefix: str) -> None:
    """The sweeper's lists are updated around the scripts here: the checks of tests/test_sweep_indexes.py."""
    from tests.test_sweep_indexes import (
        check_a_late_park_update_keeps_a_decisions_entry,
        check_a_late_refresh_never_lists_a_finished_turn,
    )

    rt = get_runtime(cluster_settings)
    check_a_late_park_update_keeps_a_decisions_entry(rt, prefix)
    check_a_late_refresh_never_lists_a_finished_turn(rt, prefix)


@pytest.mark.skipif(not amqp_available(), reason="RabbitMQ is not reachable on 127.0.0.1:5672")
def test_a_driven_batch_parks_is_approved_in_bulk_and_finishes_on_the_cluster(
    cluster_settings: Settings, tmp_path: Path
) -> None:
    """`stepq batch submit` driven by a worker, its status and `stepq approve --batch` reading turns that live in
    many slots, each approval resuming its turn through the sharded lists."""
    import json

    from tests.test_batch import _cli, _lines, _write

    worker = WorkerProcess(cluster_settings, "cl5", concurrency=4)
    try:
        items = tmp_path / "items.jsonl"
        _write(items, [{"key": f"g-{i}", "prompt": f"publish {i}"} for i in range(12)])
        submit = _cli(cluster_settings, "batch", "submit", "--agent", "bt.gated", "--input", str(items),
                      "--concurrency", "12", "--batch-id", "cluster-gated")  # fmt: skip
        assert submit.returncode == 0, submit.stderr

        def parked() -> bool:
            status = _cli(cluster_settings, "batch", "status", "cluster-gated", "--json")
            assert status.returncode == 0, status.stderr
            return bool(json.loads(status.stdout)["awaiting_approval"] == 12)

        eventually(parked, timeout=120, what="12 items awaiting approval")
        decided = _cli(cluster_settings, "approve", "--batch", "cluster-gated", "--all", "--yes", "--timeout", "120")
        assert decided.returncode == 0 and "approved 12, refused 0" in decided.stdout, decided.stderr
        done = _cli(cluster_settings, "batch", "wait", "cluster-gated", "--output", str(tmp_path / "out.jsonl"))
        assert done.returncode == 0, done.stderr
        rows = _lines(tmp_path / "out.jsonl")
        assert len(rows) == 12 and {r["status"] for r in rows} == {"completed"}
        rt = get_runtime(cluster_settings)
        assert int(rt.redis.hget(rt.keys.batch("cluster-gated"), "created")) == 12
        assert rt.turns.indexes.count("active") == 0 and rt.turns.indexes.count("awaiting") == 0
    finally:
        worker.stop()


def test_provider_batch_steps_park_batch_and_resume_on_the_cluster(cluster_url: str, prefix: str) -> None:
    """A turn whose steps go through a provider batch (the scripted model's, offline): its request in its turn's
    slot, the group queue and the batches in the provider batches' slot, the awaiting/active shards in theirs."""
    from tests.test_provider_batch import PRICES, run_to_end, submit

    settings = make_settings(
        prefix, redis_url=cluster_url, broker_url=AMQP_URL, provider_batch_window_s=0, retry_max_attempts=2,
        prices=PRICES,
    )  # fmt: skip
    rt = get_runtime(settings)
    turn_ids = [submit(rt, agent="agents_pbatch.scripted") for _ in range(3)]
    run_to_end(rt, *turn_ids)
    for turn_id in turn_ids:
        state = rt.turns.load(turn_id)
        assert state is not None and state.text == "enriched A-1"
        assert [t.batch for t in state.trace.steps] == [True, True]
    assert rt.turns.indexes.count("active") == 0 and rt.turns.indexes.count("awaiting") == 0


def test_tenant_policies_are_written_and_read_by_steps_on_the_cluster(cluster_settings: Settings, prefix: str) -> None:
    """A policy write updates three keys in one script (they share a tag); a step reads the policies' version
    from their slot, next to its own begin script in the turn's slot."""
    from stepq.engine.runner import StepRunner
    from stepq.turns.submit import create_turn

    rt = get_runtime(cluster_settings)
    assert rt.policies.update("acme", "*", {"max_steps": 5}) is not None
    assert rt.policies.tenants() == ["acme"]
    state, _ = create_turn(rt, "rt.basic", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "next"
    rt.policies.clear("acme")
    assert rt.policies.get("acme") == {}
