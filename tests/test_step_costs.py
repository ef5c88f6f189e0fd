"""Cost guards: the Redis round trips and commands of one step of each kind, and the JSON encodes/decodes per
streamed delta. Timing is not tested (a loaded machine makes it noise); cost is countable, and counted exactly:
a change that adds a round trip, a command or a JSON pass must change a number here, on purpose.

Where it is counted:
- Redis at the socket. The runtime's client (every store's, and whatever else calls `get_redis`) is the client
  `stepq.store.connection` makes for the URL, same options, on a `Connection` subclass that records each
  `send_packed_command`: one request written, i.e. one round trip (a command, or a whole pipeline), and the
  commands packed in it, parsed from the RESP bytes that go out.
- JSON at the encoder/decoder: the stdlib's `JSONEncoder.encode` / `JSONDecoder.decode` (every `json.dumps` /
  `json.loads`: the dispatcher's and the tracer's passes), pydantic-core's `to_json` / `from_json` (`stepq.jsonsafe`:
  the event log's event bodies, the raw streams' SSE events), all four counted as JSON, and pydantic's
  `model_dump_json` / `model_validate_json` / `TypeAdapter.dump_json` / `validate_json` (state, transcript,
  results), counted apart.

Why the counts do not depend on timing (`make test-stress` runs this with CPU burners):
- A connection's own handshake (HELLO / CLIENT SETINFO when the pool opens one, which depends on how many
  threads hold a connection at that instant) and redis-py's idle health-check PING (the clock) are not counted.
- The lease heartbeat thread (`stepq-leases`: one pipeline per poll tick, as often as the clock says) is not
  counted. Every other thread is: the delivering one, the tool executor's, the flush timer's.
- Only the test's own runtime is counted (its client has a connection class of its own): an earlier test's
  runtime in the same pytest process may still send something late (its flush timer, its leases).
- The coalescing window is 120 s (`WINDOW_MS`), far longer than a step takes even under load, so the flush timer
  never sends anything: deferred events and writes go in the step's own trips, and of a streamed answer the
  first delta goes out at once (the first after a quiet window) and the rest with the commit. The window-0
  runtime publishes each delta as it comes: the worst case, and what a slow stream costs at any window.
- The counted delivery is step 1 of a turn, after a step 0 of the same kind in this process (the per-process
  history caches warm, as in a long turn), after a whole warm-up turn of the same agent. Every script the
  runtime names is loaded into Redis's script cache before anything is counted (no NOSCRIPT reload trip, on a
  fresh Redis too).

Not counted, because a delivery does not do it: Celery's enqueue of the next step (the task does, around
`StepRunner.deliver`) and the model's latency (the scripted model has none). See docs/benchmarks.md
(`bench.step_overhead`) for what these trips cost in time.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pydantic_core
import pytest
import redis

from stepq.config.settings import Settings
from stepq.engine import emitter
from stepq.engine.decisions import decide_approval
from stepq.engine.runner import Decision, StepRunner
from stepq.fleet.runtime import Runtime
from stepq.models import EventType, ToolResultMessage, ToolResultStatus, TurnStatus, UserMessage, carry_files
from stepq.store import connection
from stepq.store.leases import StepLease
from stepq.turns.submit import create_turn
from tests.agents_costs import STREAM_DELTAS
from tests.agents_engine import start
from tests.conftest import make_settings

WINDOW_MS = 120_000.0  # no flush on the timer while a step runs (see the module docstring)
NOT_COUNTED_THREADS = frozenset({"stepq-leases"})


@dataclass(frozen=True)
class Cost:
    trips: int
    commands: int
    json_encodes: int = 0
    json_decodes: int = 0
    pydantic_encodes: int = 0
    pydantic_decodes: int = 0


@dataclass
class Counter:
    """What the counted threads sent to Redis and passed through JSON while `active`."""

    active: bool = False
    trips: list[list[str]] = field(default_factory=list)  # per round trip, its commands (EVALSHA: the script)
    json: dict[str, int] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)  # sha -> a name, for readable failures
    lock: threading.Lock = field(default_factory=threading.Lock)
    connection_class: type[redis.Connection] | None = None  # the counted runtime's: an earlier test's is not

    def counting(self) -> bool:
        return self.active and threading.current_thread().name not in NOT_COUNTED_THREADS

    def record_trip(self, packed: Any) -> None:
        names = [self._name(args) for args in _commands(packed)]
        with self.lock:
            self.trips.append(names)

    def bump(self, what: str) -> None:
        with self.lock:
            self.json[what] = self.json.get(what, 0) + 1

    def _name(self, args: list[bytes]) -> str:
        name = args[0].decode().upper()
        if name != "EVALSHA":
            return name
        script = self.scripts.get(args[1].decode(), args[1].decode()[:8])
        if script == "publish":  # the events it writes, by type (a regex: json here would count itself)
            types = re.findall(rb'"type":"([a-z-]+)"', b"".join(args[int(args[2]) + 4 :: 3]))
            return f"EVALSHA(publish: {', '.join(t.decode() for t in types)})"
        return f"EVALSHA({script})"

    def reset(self) -> None:
        self.trips.clear()
        self.json.clear()

    def cost(self) -> Cost:
        j = self.json
        return Cost(
            trips=len(self.trips),
            commands=sum(len(t) for t in self.trips),
            json_encodes=j.get("json_encodes", 0),
            json_decodes=j.get("json_decodes", 0),
            pydantic_encodes=j.get("pydantic_encodes", 0),
            pydantic_decodes=j.get("pydantic_decodes", 0),
        )

    def redis_cost(self) -> Cost:
        return Cost(len(self.trips), sum(len(t) for t in self.trips))

    def describe(self) -> str:
        return "\n".join(f"  trip {i}: {' | '.join(t)}" for i, t in enumerate(self.trips)) + f"\n  {self.cost()}"


def _commands(packed: Any) -> list[list[bytes]]:
    """The commands in what redis-py writes to the socket: one RESP array of bulk strings per command."""
    parts = [packed] if isinstance(packed, str | bytes | memoryview) else packed
    data = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts)
    commands, i = [], 0
    while i < len(data):
        assert data[i : i + 1] == b"*", data[i : i + 20]
        end = data.index(b"\r\n", i)
        count, i = int(data[i + 1 : end]), end + 2
        args = []
        for _ in range(count):
            assert data[i : i + 1] == b"$", data[i : i + 20]
            end = data.index(b"\r\n", i)
            size, i = int(data[i + 1 : end]), end + 2
            args.append(data[i : i + size])
            i += size + 2
        commands.append(args)
    return commands


COUNTER = Counter()


class CountingConnection(redis.Connection):
    """A real connection that records each request it writes, except its own handshake and health checks."""

    _internal = 0  # >0 while the connection talks for itself (connect, health-check PING)

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        self._internal += 1
        try:
            super().connect_check_health(*args, **kwargs)
        finally:
            self._internal -= 1

    def check_health(self) -> None:
        self._internal += 1
        try:
            super().check_health()
        finally:
            self._internal -= 1

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._internal and type(self) is COUNTER.connection_class and COUNTER.counting():
            COUNTER.record_trip(command)
        super().send_packed_command(command, check_health)


@pytest.fixture
def counter() -> Iterator[Counter]:
    """The counter, with the JSON encoders and decoders counting while it is active."""
    patches = pytest.MonkeyPatch()

    def wrap(fn: Any, what: str) -> Any:
        def counted_call(*args: Any, **kwargs: Any) -> Any:
            if COUNTER.counting():
                COUNTER.bump(what)
            return fn(*args, **kwargs)

        return counted_call

    validate_json = pydantic.BaseModel.model_validate_json.__func__  # type: ignore[attr-defined]
    patches.setattr(json.JSONEncoder, "encode", wrap(json.JSONEncoder.encode, "json_encodes"))
    patches.setattr(json.JSONDecoder, "decode", wrap(json.JSONDecoder.decode, "json_decodes"))
    patches.setattr(pydantic_core, "to_json", wrap(pydantic_core.to_json, "json_encodes"))
    patches.setattr(pydantic_core, "from_json", wrap(pydantic_core.from_json, "json_decodes"))
    patches.setattr(pydantic.BaseModel, "model_dump_json", wrap(pydantic.BaseModel.model_dump_json, "pydantic_encodes"))
    patches.setattr(pydantic.BaseModel, "model_validate_json", classmethod(wrap(validate_json, "pydantic_decodes")))
    patches.setattr(pydantic.TypeAdapter, "dump_json", wrap(pydantic.TypeAdapter.dump_json, "pydantic_encodes"))
    patches.setattr(pydantic.TypeAdapter, "validate_json", wrap(pydantic.TypeAdapter.validate_json, "pydantic_decodes"))
    COUNTER.active = False
    COUNTER.reset()
    try:
        yield COUNTER
    finally:
        COUNTER.active = False
        COUNTER.reset()
        patches.undo()


def counting_runtime(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    """A runtime (built afresh, not cached) whose one Redis client counts: the client `get_redis` makes for
    this URL, with the same options, on a CountingConnection class of its own: what an earlier test's runtime
    still sends (a timed flush, a lease's release) is not counted as this test's."""
    assert settings.redis_url
    counted_connection = type("CountingConnection", (CountingConnection,), {})
    COUNTER.connection_class = counted_connection
    client = redis.Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        max_connections=connection.MAX_CONNECTIONS,
        connection_class=counted_connection,
        **connection.client_options(settings),
    )
    monkeypatch.setitem(connection._clients, connection._url_key(settings), client)
    rt = Runtime.build(settings)
    assert rt.redis is client
    scripts = {
        "begin": rt.turns._begin,
        "publish": rt.events._publish,
        "release": rt.leases._release,
        "renew": rt.leases._renew,
    }
    owners = (
        (rt.turns, ""),
        (rt.tool_results, "result."),
        (rt.approvals, "approval."),
        (rt.turns.listings, "listing."),
    )
    for owner, label in owners:
        for attr, value in vars(owner).items():
            if hasattr(value, "sha") and hasattr(value, "script"):
                scripts.setdefault(label + attr.strip("_"), value)
    COUNTER.scripts = {script.sha: name for name, script in scripts.items()}
    for script in scripts.values():  # in Redis's script cache, whatever ran before: no NOSCRIPT reload counted
        client.script_load(script.script)
    return rt


@pytest.fixture
def costs_rt(prefix: str, monkeypatch: pytest.MonkeyPatch, counter: Counter) -> Iterator[Runtime]:
    """The coalescing runtime: a window no step outlasts. (A stream's first delta goes out at once: a new
    emitter has never flushed, whatever the monotonic clock reads.)"""
    rt = counting_runtime(make_settings(prefix, coalesce_window_ms=WINDOW_MS), monkeypatch)
    yield rt
    rt.redis.close()


@pytest.fixture
def unbatched_rt(prefix: str, monkeypatch: pytest.MonkeyPatch, counter: Counter) -> Iterator[Runtime]:
    """Window 0: every delta is published as it comes. The flush timer is switched off: at window 0 it would
    send an event the step deferred (step-start, step-finish) 1 ms later if no write of the step came first,
    in a trip of its own, so a loaded machine would count one more. Without it, deferred events go with the
    step's next write, as they do on time."""
    monkeypatch.setattr(emitter._TIMER, "schedule", lambda when, step_emitter: None)
    rt = counting_runtime(make_settings(prefix, coalesce_window_ms=0.0), monkeypatch)
    yield rt
    rt.redis.close()


def approve(rt: Runtime, turn_id: str) -> None:
    """Approve every call the parked turn waits for (as a reviewer does; not counted)."""
    state = rt.turns.load(turn_id)
    assert state is not None and state.parked is not None and state.parked.approvals, state
    for pending in state.parked.approvals:
        record = rt.approvals.get(pending.approval_id)
        assert record is not None
        assert decide_approval(rt, pending.approval_id, record.token, True).accepted


def deliver(rt: Runtime, turn_id: str, step: int) -> Decision:
    """Deliver a step; one that parks for approval is approved and delivered again."""
    decision = StepRunner(rt).deliver(turn_id, step)
    if decision.action == "none" and decision.reason.startswith("parked"):
        approve(rt, turn_id)
        decision = StepRunner(rt).deliver(turn_id, step)
    return decision


def counted(rt: Runtime, turn_id: str, step: int) -> Decision:
    """One delivery, counted (nothing else is)."""
    COUNTER.reset()
    COUNTER.active = True
    try:
        return StepRunner(rt).deliver(turn_id, step)
    finally:
        COUNTER.active = False


def warm_turn(rt: Runtime, agent: str, prefix: str) -> str:
    """Run a whole warm-up turn of `agent`, then start a second one and run its step 0; returns its id."""
    warm = start(rt, agent, prefix)
    step = 0
    for _ in range(5):
        decision = deliver(rt, warm, step)
        if decision.action != "next":
            break
        step = decision.step
    state = rt.turns.load(warm)
    assert state is not None and state.status == TurnStatus.COMPLETED, state
    turn_id = start(rt, agent, prefix)
    assert deliver(rt, turn_id, 0).action == "next"
    return turn_id


def step_results(rt: Runtime, turn_id: str, step: int) -> list[ToolResultStatus]:
    state = rt.turns.load(turn_id)
    assert state is not None
    prefix = f"call_{step}_"
    return [
        r.status
        for m in state.messages
        if isinstance(m, ToolResultMessage)
        for r in m.results
        if r.tool_call_id.startswith(prefix)
    ]


# --------------------------------------------------------------------------- the counter itself


def test_the_counter_sees_each_round_trip_and_each_command(costs_rt, counter, prefix):
    """The guards below are only as good as the counter: a command is one trip, a pipeline one trip of many
    commands, a script call one EVALSHA; nothing is counted while it is not active."""
    r = costs_rt.redis
    counter.active = True
    r.get(f"{prefix}:x")
    pipe = r.pipeline(transaction=False)
    pipe.set(f"{prefix}:x", "1").get(f"{prefix}:x").delete(f"{prefix}:x")
    pipe.execute()
    costs_rt.leases._release(keys=[f"{prefix}:lease", f"{prefix}:started"], args=["token"])
    counter.active = False
    r.get(f"{prefix}:x")
    assert counter.trips == [["GET"], ["SET", "GET", "DEL"], ["EVALSHA(release)"]]


# --------------------------------------------------------------------------- one step of each kind


def test_plain_tool_step(costs_rt, counter, prefix):
    """bench.step_overhead's step: the model asks for one trivial tool, the tool runs, the loop goes on."""
    turn_id = warm_turn(costs_rt, "cost.plain", prefix)
    assert counted(costs_rt, turn_id, 1).action == "next"
    assert step_results(costs_rt, turn_id, 1) == [ToolResultStatus.OK]
    # trip 0: the step-start script (takes the lease; reads the cancel and emitted flags, the checkpoint, the
    #         state and the history past what this process holds, the policy version)
    # trip 1: one pipeline: the tool's stored result, the step's events (step-start, step-finish, tool-call,
    #         tool-result) as one script call, and the fenced commit that releases the lease
    assert counter.redis_cost() == Cost(trips=2, commands=4), counter.describe()


def test_read_only_step_of_two_calls(costs_rt, counter, prefix):
    """Two read-only tool calls in one step: their results wait for the commit's trip (a crash before it may
    run them again, which is safe), so a read-only call adds a command, never a round trip."""
    turn_id = warm_turn(costs_rt, "cost.read_only", prefix)
    assert counted(costs_rt, turn_id, 1).action == "next"
    assert step_results(costs_rt, turn_id, 1) == [ToolResultStatus.OK, ToolResultStatus.OK]
    # trip 0: the step-start script
    # trip 1: one pipeline: the two stored results, the step's events as one script call, the fenced commit
    assert counter.redis_cost() == Cost(trips=2, commands=5), counter.describe()


def test_side_effect_step(costs_rt, counter, prefix):
    """A tool with side effects that runs without approval (`destructive`, under `confirm-required`): it must
    run once, so it is bracketed by durable writes."""
    turn_id = warm_turn(costs_rt, "cost.side_effect", prefix)
    assert counted(costs_rt, turn_id, 1).action == "next"
    assert step_results(costs_rt, turn_id, 1) == [ToolResultStatus.OK]
    # trip 0: the step-start script
    # trip 1: before the tool runs: the step's checkpoint (the answer, so a re-run replays the same call ids)
    #         and the events so far (step-start, tool-call, step-finish) in one pipeline
    # trip 2: right after it returns: its stored result (a re-run finds it and does not run the tool again)
    # trip 3: the tool-result event and the fenced commit
    assert counter.redis_cost() == Cost(trips=4, commands=6), counter.describe()


def test_mutation_step_parks_then_runs_once_approved(costs_rt, counter, prefix):
    """A `mutation` tool under `confirm-required`: its step parks for a person's approval (one delivery), and
    once approved the step is delivered again and runs it (a second delivery). The decision in between is the
    approve task's work, not a step's, and is not counted."""
    turn_id = warm_turn(costs_rt, "cost.mutation", prefix)

    parked = counted(costs_rt, turn_id, 1)
    assert parked.action == "none" and parked.reason == "parked (awaiting_approval)"
    # trip 0: the step-start script
    # trip 1: the approval's record (MULTI, HSET, EXPIRE, EXEC: a transaction; one per gated call)
    # trip 2: the step's events (step-start, step-finish, tool-call), the approval's pending listing, the fenced
    #         commit that parks the turn and the turn's listing moving with its status (stepq.store.listings)
    # trip 3: the pending-approvals index (ZADD, stepq_pending_approvals), after the commit
    # trip 4: the approval-request event, after the commit (a reviewer never sees a request for a turn
    #         that did not park)
    assert counter.redis_cost() == Cost(trips=5, commands=11), counter.describe()

    approve(costs_rt, turn_id)
    resumed = counted(costs_rt, turn_id, 1)
    assert resumed.action == "next", resumed
    assert step_results(costs_rt, turn_id, 1) == [ToolResultStatus.OK]
    # trip 0: the step-start script
    # trip 1: the approval's record (HGETALL; one trip per approval): the decision
    # trip 2: the results already stored for the step's calls (HMGET): none, so the tool runs
    # trip 3: right after it returns: its stored result
    # trip 4: the tool-result event, the fenced commit (step-finish went out when the step parked) and the
    #         turn's listing leaving awaiting_approval for running (stepq.store.listings)
    assert counter.redis_cost() == Cost(trips=5, commands=7), counter.describe()


@pytest.mark.parametrize("deltas", STREAM_DELTAS)
def test_streamed_answer_step(costs_rt, counter, prefix, deltas):
    """The final answer streamed as K text deltas, coalesced: the same round trips for any K."""
    turn_id = warm_turn(costs_rt, f"cost.stream_{deltas}", prefix)
    assert counted(costs_rt, turn_id, 1).action == "none"
    state = costs_rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED
    # trip 0: the step-start script
    # trip 1: step-start and the first delta, at once (the first delta after a quiet window is not held back)
    # trip 2: the other deltas (one text-delta event) and step-finish, the fenced commit that finishes and
    #         writes turn-finish itself (only if it takes: a subscriber that sees it can read the finished
    #         turn), and the turn's listing moving with its status (stepq.store.listings)
    assert counter.redis_cost() == Cost(trips=3, commands=5), counter.describe()


def test_a_new_turns_first_streamed_step_shows_it_running_in_a_trip_it_has_anyway(costs_rt, counter, prefix):
    """A queued turn's first step: the commit showing it running rides with step-start and the first delta, so
    the model call waits only for the step-start script (time to first chunk) and the step costs no extra trip."""
    deliver(costs_rt, start(costs_rt, "cost.first_stream", prefix), 0)  # warm: scripts loaded, caches filled
    turn_id = start(costs_rt, "cost.first_stream", prefix)
    assert counted(costs_rt, turn_id, 0).action == "none"
    state = costs_rt.turns.load(turn_id)
    assert state is not None and state.status == TurnStatus.COMPLETED and state.started_at
    # trip 0: the step-start script
    # trip 1: the commit showing the turn running and its listing, then step-start and the first delta
    # trip 2: the other deltas and step-finish, the fenced commit that finishes and writes turn-finish, and the
    #         turn's listing moving with its status
    riding = ["EVALSHA(commit)", "EVALSHA(listing.turn_script)", "EVALSHA(publish: step-start, text-delta)"]
    assert counter.trips[1] == riding, counter.describe()
    assert counter.redis_cost() == Cost(trips=3, commands=7), counter.describe()


@pytest.mark.parametrize("deltas", STREAM_DELTAS)
def test_streamed_answer_step_publishing_every_delta(unbatched_rt, counter, prefix, deltas):
    """Window 0 (or a stream slower than the window): each delta is one round trip of one script call."""
    turn_id = warm_turn(unbatched_rt, f"cost.stream_{deltas}", prefix)
    assert counted(unbatched_rt, turn_id, 1).action == "none"
    # trip 0: the step-start script; trip 1: step-start and the first delta; then one trip per further delta;
    # then step-finish with the fenced commit (which writes turn-finish) and the turn's listing
    assert counter.redis_cost() == Cost(trips=2 + deltas, commands=4 + deltas), counter.describe()


# --------------------------------------------------------------------------- per delta


def _streamed_cost(rt: Runtime, prefix: str, deltas: int) -> Cost:
    turn_id = warm_turn(rt, f"cost.stream_{deltas}", prefix)
    assert counted(rt, turn_id, 1).action == "none"
    return COUNTER.cost()


def _per_delta_and_fixed(rt: Runtime, prefix: str) -> tuple[Cost, Cost]:
    """The cost of a streamed answer step of K and K' deltas: (K' - K) apart gives the exact cost per delta,
    and what is left at K the step's fixed part."""
    k, k2 = STREAM_DELTAS[1], STREAM_DELTAS[2]
    low, high = _streamed_cost(rt, prefix, k), _streamed_cost(rt, prefix, k2)
    names = list(Cost.__dataclass_fields__)
    diffs = {n: getattr(high, n) - getattr(low, n) for n in names}
    assert all(d % (k2 - k) == 0 for d in diffs.values()), (low, high)  # linear in K, exactly
    per_delta = Cost(**{n: d // (k2 - k) for n, d in diffs.items()})
    fixed = Cost(**{n: getattr(low, n) - k * getattr(per_delta, n) for n in names})
    return per_delta, fixed


def test_json_and_redis_cost_per_delta_published_one_by_one(unbatched_rt, counter, prefix):
    """Each delta on its own (window 0): one event, so one `json.dumps` of its envelope (events.py
    `submit_many`), one round trip of one script call; the emitter parses nothing and no model is (de)serialized."""
    per_delta, fixed = _per_delta_and_fixed(unbatched_rt, prefix)
    assert per_delta == Cost(trips=1, commands=1, json_encodes=1), (per_delta, fixed)
    # fixed: the trips as in test_streamed_answer_step_publishing_every_delta; json: the envelopes of
    # step-start, step-finish and turn-finish; pydantic: the commit's state, its new message and its new
    # trace entry out, the step-start's state in
    assert fixed == Cost(trips=2, commands=4, json_encodes=3, pydantic_encodes=3, pydantic_decodes=1), fixed


def test_json_and_redis_cost_per_delta_coalesced(costs_rt, counter, prefix):
    """Coalesced within the window: a delta costs no round trip and no JSON pass (its text joins the buffer;
    the buffer is one event)."""
    per_delta, fixed = _per_delta_and_fixed(costs_rt, prefix)
    assert per_delta == Cost(trips=0, commands=0), (per_delta, fixed)
    # fixed: the trips as in test_streamed_answer_step; json: the envelopes of step-start, the first delta,
    # the other deltas, step-finish and turn-finish; pydantic as above
    assert fixed == Cost(trips=3, commands=5, json_encodes=5, pydantic_encodes=3, pydantic_decodes=1), fixed


def test_a_tool_step_under_a_tenant_quota_adds_a_command_not_a_round_trip(costs_rt, counter, prefix):
    """Issue 27 item 6: the quota's counter is read with the step-start script (this process ran the turn's
    step 0, so it knows which counter the turn checks) and the step's usage is added in the commit's pipeline."""
    costs_rt.policies.update("acme", "*", {"quota": {"tokens": 10_000_000, "window_s": 3600}})

    def tenant_turn() -> str:
        state, _ = create_turn(costs_rt, "cost.plain", prompt="go", metadata={"prefix": prefix, "tenant": "acme"})
        return state.turn_id

    warm = tenant_turn()
    for step in range(3):
        if deliver(costs_rt, warm, step).action != "next":
            break
    turn_id = tenant_turn()
    assert deliver(costs_rt, turn_id, 0).action == "next"
    assert counted(costs_rt, turn_id, 1).action == "next"
    # trip 0: the step-start script, which also reads the quota counter (an HMGET inside the script)
    # trip 1: the plain tool step's pipeline plus the quota count script (one more command, same trip)
    assert counter.redis_cost() == Cost(trips=2, commands=5), counter.describe()


# --------------------------------------------------------------------------- a submit


def test_storing_a_turn_with_its_turn_start_is_one_round_trip(costs_rt, counter, prefix):
    """The create script writes the turn's `turn-start` itself (only if it stores the turn), in the MULTI
    with the tenant listing's update: the time to a turn's first chunk starts with this one trip (a Client on a
    Redis broker pushes the first step's message in it too: tests/test_broker_capture.py). A repeated
    idempotency key stores nothing and announces nothing."""
    warm, _ = create_turn(costs_rt, "cost.plain", prompt="go", metadata={"prefix": prefix})
    counter.active = True
    state, created = create_turn(costs_rt, "cost.plain", prompt="go", idempotency_key="k1", metadata={"prefix": prefix})
    counter.active = False
    assert created
    assert counter.trips == [["MULTI", "EVALSHA(create)", "EVALSHA(listing.turn_script)", "EXEC"]], counter.describe()
    events = costs_rt.events.read(state.turn_id)
    assert [(e.seq, e.type, e.data["agent"]) for e in events] == [(1, EventType.TURN_START, "cost.plain")]
    again, created = create_turn(costs_rt, "cost.plain", prompt="go", idempotency_key="k1", metadata={"prefix": prefix})
    assert not created and again.turn_id == state.turn_id
    assert costs_rt.events.last_seq(state.turn_id) == 1
    assert costs_rt.events.read(warm.turn_id)[0].type == EventType.TURN_START


# --------------------------------------------------------------------------- the transcript's files


def test_a_step_reads_the_files_of_no_message_it_has_seen_before(costs_rt, counter, prefix, monkeypatch):
    """A step must know whether its transcript carries files (their bytes go to the model). Only user messages
    carry them; asking each one, every step, made a long turn's steps O(its length) (~0.1 µs a message: 20 % of
    a plain step by its 1000th). The store notes it as messages are appended, so a step of a turn whose
    transcript holds 40 user messages asks none of them. Counted: every read of a user message's `files`."""
    reads: list[int] = []
    plain_getattribute = UserMessage.__getattribute__

    def counting_getattribute(self: UserMessage, name: str) -> Any:
        if name == "files" and counter.active:
            reads.append(1)
        return plain_getattribute(self, name)

    monkeypatch.setattr(UserMessage, "__getattribute__", counting_getattribute)
    history = [
        {"role": "user", "content": f"question {i}"}
        if i % 2 == 0
        else {"role": "assistant", "parts": [{"type": "text", "text": "ok"}]}
        for i in range(79)
    ]
    turn_id = start(costs_rt, "cost.plain", prefix, prompt=None, messages=history)
    assert deliver(costs_rt, turn_id, 0).action == "next"  # this process has stored and seen its transcript
    assert counted(costs_rt, turn_id, 1).action == "next"
    assert sum(reads) == 0
    state = costs_rt.turns.load(turn_id)
    assert state is not None and len(state.messages) == 83 and not state.carries_files()
    counter.active = True  # the counter counts: a scan of this transcript asks its 40 user messages
    assert not carry_files(state.messages)
    counter.active = False
    assert sum(reads) == 40


# --------------------------------------------------------------------------- the lease heartbeat


def test_the_lease_heartbeat_reads_every_steps_cancel_flag_in_one_command(costs_rt, counter, prefix):
    """A tick of the heartbeat (the `stepq-leases` thread, 20 a second by default) costs one MGET whatever the
    number of steps running, plus one pipeline of the renewals that are due; a cancel flag reaches only its
    own step, and a lease no longer held is lost."""
    leases = [StepLease(f"turn_{i:032x}", costs_rt.leases.new_token(), 6000) for i in range(50)]
    costs_rt.redis.set(costs_rt.keys.cancel(leases[7].turn_id), "1", ex=60)
    counter.active = True
    costs_rt.leases._tick(leases)  # none due: each was renewed (taken) just now
    assert counter.trips == [["MGET"]], counter.describe()
    assert [lease.turn_id for lease in leases if lease.cancelled.is_set()] == [leases[7].turn_id]
    counter.reset()
    for lease in leases[:3]:
        lease.renewed_at -= 10  # past a third of the TTL
    costs_rt.leases._tick(leases)
    counter.active = False
    assert counter.trips == [["MGET"], ["EVALSHA(renew)"] * 3], counter.describe()
    assert [lease.lost.is_set() for lease in leases[:4]] == [True, True, True, False]  # nobody holds their keys
