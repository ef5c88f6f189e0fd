"""A rolling upgrade with real worker processes: two `celery worker`s, one loading tests/deploy_agents_v1.py and
one loading tests/deploy_agents_v2.py (the same agent ids, changed definitions), on one Redis and one broker.

Turns parked on v1 are approved once v2 is up: a compatible change moves the turn to v2 at its next step, an
incompatible one is pinned to the v1 worker (which completes it) or fails naming what changed; `stepq status`
shows both definitions and the pinned turn, `stepq drain` says when v1 is no longer needed, and the v1 worker
is then stopped with nothing lost. The UI message stream and the trace show which version ran each step.

The old worker is told to stop taking new work with Celery's own remote control (`cancel_consumer` on the shared
queues), as a deploy script would; it keeps consuming its definitions' queues (stepq.fleet.versions).
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from stepq.agents.fingerprint import version_of
from stepq.agents.registry import registry
from stepq.config.settings import Settings
from stepq.fleet.heartbeat import live_workers
from stepq.fleet.protocol import fingerprint_queue, worker_queues
from stepq.fleet.runtime import Runtime, get_runtime
from stepq.models import TurnStatus
from stepq.producer.client import Client
from stepq.workers.app import create_app
from tests.chat_support import API_KEY, chat_settings, ui_chunks
from tests.conftest import TEST_AGENT_MODULES, WorkerProcess, eventually, settings_env
from tests.gateway_support import serve
from tests.test_cli import stepq

WAIT_S = 120.0  # generous: the machine is shared and busy
V1, V2 = "tests.deploy_agents_v1", "tests.deploy_agents_v2"


def deploy(settings: Settings, module: str) -> Settings:
    """The same fleet settings with one deploy's agent module."""
    return settings.model_copy(update={"agent_modules": [module]})


def fingerprints(module: str, agent_id: str) -> str:
    """An agent's fingerprint in a deploy, computed in a fresh process (this one loads only v1)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = (
        "from stepq.agents.registry import registry; from stepq.agents.fingerprint import version_of;"
        f"registry().load_modules([{module!r}]); print(version_of(registry().get({agent_id!r})).fingerprint)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Fleet:
    """The deploy's worker processes, the producer side (a Client, the gateway) and Celery's remote control."""

    def __init__(self, prefix: str, tmp_path: Path) -> None:
        self.prefix = prefix
        self.base = chat_settings(prefix)  # the gateway's API keys; tenant = the prefix
        self.front = self.base.model_copy(update={"agent_modules": [*TEST_AGENT_MODULES, V1]})
        self.rt: Runtime = get_runtime(self.front)
        self.client = Client(self.front)
        self.control: Celery = create_app(self.front)
        self.logs = tmp_path
        self.workers: dict[str, WorkerProcess] = {}
        self.host = socket.gethostname()

    def start(self, version: str, module: str, beat: bool) -> str:
        name = f"{version}-{self.prefix}"
        log = str(self.logs / f"{version}.log")
        self.workers[version] = WorkerProcess(deploy(self.base, module), name, beat=beat, log_path=log)
        node = f"{name}@{self.host}"
        eventually(lambda: self.beat_of(node) is not None, timeout=WAIT_S, what=f"{node}'s heartbeat")
        return node

    def beat_of(self, node: str) -> dict[str, Any] | None:
        return next((w for w in live_workers(self.rt.redis, self.front.state_prefix) if w["name"] == node), None)

    def consume(self, node: str, queue: str, on: bool) -> None:
        """Celery remote control: the worker starts or stops consuming a queue (and says it did)."""
        control = self.control.control
        call = control.add_consumer if on else control.cancel_consumer
        replies = call(queue, destination=[node], reply=True, timeout=WAIT_S)
        assert replies and all("ok" in next(iter(r.values())) for r in replies), replies

    def env(self, module: str) -> dict[str, str]:
        return settings_env(deploy(self.base, module))

    def parked_approval(self, turn_id: str) -> str:
        eventually(lambda: self.client.get(turn_id).status == TurnStatus.AWAITING_APPROVAL, WAIT_S, "the park")
        parked = self.client.get(turn_id).parked
        assert parked is not None
        return parked.approvals[0].approval_id

    def ran(self, turn_id: str, tool: str) -> tuple[int, str | None]:
        """How often the tool ran for the turn, and which deploy ran it last."""
        r = self.rt.redis
        count = r.get(f"{self.prefix}:ran:{turn_id}:{tool}")
        by = r.get(f"{self.prefix}:ran-by:{turn_id}:{tool}")
        return int(count or 0), by.decode() if isinstance(by, bytes) else by

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        self.client.close()


@pytest.fixture
def fleet(prefix: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(prefix, tmp_path)
    try:
        yield f
    finally:
        f.stop()


def chat_question(text: str) -> dict[str, Any]:
    return {"id": f"u-{uuid.uuid4().hex[:6]}", "role": "user", "parts": [{"type": "text", "text": text}]}


def approval_answer(chunks: list[dict[str, Any]], tool: str) -> dict[str, Any]:
    [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
    part = {
        "type": f"tool-{tool}",
        "toolCallId": request["toolCallId"],
        "state": "approval-responded",
        "approval": {"id": request["approvalId"], "approved": True},
    }
    return {"id": chunks[0]["messageId"], "role": "assistant", "parts": [part]}


def versions_shown(chunks: list[dict[str, Any]]) -> dict[int, tuple[str, str]]:
    """Step -> (short fingerprint, version) from the UI stream's data-agent-version parts."""
    return {
        c["data"]["step"]: (c["data"]["fingerprint"], c["data"]["version"])
        for c in chunks
        if c["type"] == "data-agent-version"
    }


def test_a_rolling_upgrade_moves_pins_fails_and_drains_with_nothing_lost(fleet: Fleet, tmp_path: Path) -> None:
    refunds_v1 = version_of(registry().get("deploy.refunds")).fingerprint  # type: ignore[arg-type]
    charges_v1 = version_of(registry().get("deploy.charges")).fingerprint  # type: ignore[arg-type]
    refunds_v2, charges_v2 = fingerprints(V2, "deploy.refunds"), fingerprints(V2, "deploy.charges")
    assert refunds_v1 != refunds_v2 and charges_v1 != charges_v2

    old = fleet.start("v1", V1, beat=False)
    beat = fleet.beat_of(old)
    assert beat is not None and beat["agents"]["deploy.charges"]["fingerprint"] == charges_v1
    pinned_queue = fingerprint_queue(fleet.front, "deploy.charges", charges_v1)
    assert pinned_queue in beat["queues"]  # the old worker consumes its definitions' queues

    with (
        serve(fleet.front) as served,
        httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=WAIT_S) as http,
    ):
        # three turns park on v1: a chat (compatible change ahead), a pinned one and a failing one
        question = chat_question("refund A1")
        url = "/v1/chat?agent=deploy.refunds"
        body = {"id": "deploy-chat", "messages": [question], "trigger": "submit-message"}
        with http.stream("POST", url, json=body) as response:
            parked_chat = ui_chunks(response)
        assert parked_chat[-1]["messageMetadata"]["status"] == "awaiting_approval"
        assert versions_shown(parked_chat) == {0: (refunds_v1[:12], "v1")}
        chat_turn = parked_chat[0]["messageId"]
        pinned = fleet.client.submit("deploy.charges", prompt="charge A1", metadata={"prefix": fleet.prefix}).turn_id
        failing = fleet.client.submit("deploy.charges_fail", prompt="charge", metadata={"prefix": fleet.prefix})
        pinned_approval = fleet.parked_approval(pinned)
        failing_approval = fleet.parked_approval(failing.turn_id)

        # the deploy: v2 starts, and v1 stops taking new work (it keeps its definitions' queues)
        new = fleet.start("v2", V2, beat=True)
        for queue in worker_queues(fleet.front):
            fleet.consume(old, queue, on=False)
        fleet.consume(old, pinned_queue, on=False)  # held back a moment, so the pin can be seen waiting

        # (c) under `fail`, the turn fails naming what changed
        fleet.client.approve(failing_approval, True).wait(timeout=WAIT_S)
        failed = failing.wait(timeout=WAIT_S)
        assert failed.status == TurnStatus.FAILED, failed
        assert failed.error is not None
        assert failed.error.startswith("agent deploy.charges_fail changed incompatibly for this turn between its steps")
        assert "v1 (" in failed.error and "-> v2 (" in failed.error
        assert (
            "tool dp_charge's new argument schema rejects the stored arguments (currency: Field required) "
            "of a pending approval (call call_0_0)"
        ) in failed.error
        assert fleet.ran(failing.turn_id, "dp_charge") == (0, None)

        # (b) the parked approval whose tool's schema no longer takes its arguments is pinned to v1
        fleet.client.approve(pinned_approval, True).wait(timeout=WAIT_S)
        eventually(lambda: fleet.client.get(pinned).pin is not None, WAIT_S, "the pin")
        pin = fleet.client.get(pinned).pin
        assert pin is not None and pin.fingerprint == charges_v1 and pin.queue == pinned_queue
        assert pin.through_step == 0  # only the step that waits on the stored arguments needs v1

        status = stepq(fleet.env(V2), "status", check=0).stdout
        (tmp_path / "status-during-upgrade.txt").write_text(status)
        print(status)
        assert "agent versions" in status
        charges_rows = status.split("  deploy.charges\n", 1)[1].split("\n  deploy.")[0]
        assert f"{charges_v2[:12]}  v2" in charges_rows and f"{charges_v1[:12]}  v1" in charges_rows
        assert "1 worker, 1 pinned, 1 step waiting in its queue, 1 open turn last ran on it" in charges_rows

        drain = stepq(fleet.env(V2), "drain", "--agent", "deploy.charges", "--fingerprint", charges_v1[:12], check=1)
        (tmp_path / "drain-while-pinned.txt").write_text(drain.stdout)
        assert f"{pinned_queue}: 1 waiting" in drain.stdout
        assert f"needs it       {pinned} (awaiting_approval, step 0): pinned: tool dp_charge's new argument" in (
            drain.stdout
        )

        fleet.consume(old, pinned_queue, on=True)  # v1 takes the pinned step and runs the approved call
        done = fleet.client.wait(pinned, timeout=WAIT_S)
        assert done.status == TurnStatus.COMPLETED, done
        assert fleet.ran(pinned, "dp_charge") == (1, "v1")
        assert [(s.step, s.agent_version) for s in done.trace.steps] == [(0, "v1"), (1, "v2")]
        assert done.text == "answered by v2"  # its next step no longer needed v1: it moved on

        # (a) + (e) the chat's approval: a compatible change, so the turn moves to v2 at its next step
        answer = approval_answer(parked_chat, "dp_refund")
        with http.stream("POST", "/v1/chat", json={"id": "deploy-chat", "messages": [question, answer]}) as response:
            resumed = ui_chunks(response)
        assert resumed[-1]["messageMetadata"]["status"] == "completed"
        assert versions_shown(resumed) == {1: (refunds_v2[:12], "v2")}
        assert fleet.ran(chat_turn, "dp_refund") == (1, "v2")  # the resumed call ran on the new definition
        chat = fleet.client.get(chat_turn)
        assert [(s.fingerprint, s.agent_version) for s in chat.trace.steps] == [
            (refunds_v1[:12], "v1"),
            (refunds_v2[:12], "v2"),
        ]
        assert chat.started_fingerprint == refunds_v1 and chat.agent_version is not None
        assert chat.agent_version.fingerprint == refunds_v2
        shown = stepq(fleet.env(V2), "show", chat_turn, "--trace", check=0).stdout.splitlines()
        step_rows = [row for row in shown[1:] if not row.lstrip().startswith("↳")]  # not the detail lines
        assert [row.split()[-2:] for row in step_rows] == [
            ["v1", f"({refunds_v1[:12]})"],
            ["v2", f"({refunds_v2[:12]})"],
        ]

    # (d) nothing needs v1 any more: the drain says so, and the old worker is stopped
    for agent, fingerprint in (("deploy.charges", charges_v1), ("deploy.refunds", refunds_v1)):
        drained = stepq(fleet.env(V2), "drain", "--agent", agent, "--fingerprint", fingerprint[:12], check=0)
        assert "drained: nothing needs this definition" in drained.stdout, drained.stdout
    fleet.workers["v1"].stop()
    eventually(lambda: fleet.beat_of(old) is None, WAIT_S, "the old worker's goodbye")
    after = fleet.client.submit("deploy.refunds", prompt="refund again", metadata={"prefix": fleet.prefix})
    fleet.client.approve(fleet.parked_approval(after.turn_id), True).wait(timeout=WAIT_S)
    assert after.wait(timeout=WAIT_S).status == TurnStatus.COMPLETED
    assert fleet.ran(after.turn_id, "dp_refund") == (1, "v2")
    for turn_id in (chat_turn, pinned, failing.turn_id, after.turn_id):
        assert fleet.client.get(turn_id).status.terminal
    assert fleet.beat_of(new) is not None


def test_the_sweeper_leaves_a_pinned_step_waiting_in_its_queue(rt: Runtime, prefix: str) -> None:
    """A pinned step waits for a worker of its definition: re-sending it to the shared queue would only have a
    new worker route it back, one more copy per sweep. A crashed pinned step is still recovered."""
    from stepq.engine import upgrade
    from stepq.engine.context import Delivery
    from stepq.engine.decisions import decide_approval, sweep
    from stepq.engine.emitter import StepEmitter
    from stepq.engine.runner import StepRunner
    from stepq.models import AgentVersion, EventType
    from stepq.store.turns import StepStart
    from stepq.turns.submit import create_turn

    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix})
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"  # parked on a real approval
    [request] = [e for e in rt.events.read(state.turn_id) if e.type == EventType.APPROVAL_REQUEST]
    approval_id = request.data["approval_id"]
    assert decide_approval(rt, approval_id, rt.approvals.get(approval_id).token, True).accepted

    token = rt.leases.new_token()  # the resume's delivery on a worker of another definition pins the turn
    start = rt.turns.begin_step(state.turn_id, 0, token, rt.leases.ttl_ms)
    assert isinstance(start, StepStart) and start.state is not None
    lease = rt.leases.adopt(state.turn_id, token)
    delivery = Delivery(rt=rt, state=start.state, lease=lease, emitter=StepEmitter(rt.events, state.turn_id, 0, 0.005))
    decision = upgrade.pin(delivery, AgentVersion(fingerprint="0" * 64), "a test pin", through_step=None)
    rt.leases.release(lease)
    assert (decision.action, decision.queue) == ("next", f"{rt.settings.queue}.fp.rt.approver.000000000000")

    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=0.0) == []  # its step waits in the pinned queue
    rt.redis.set(rt.keys.started(state.turn_id), 0)  # a worker of its definition died mid-step
    rt.redis.delete(rt.keys.sweep_lock)
    assert sweep(rt, queued_grace_s=0.0) == [(state.turn_id, 0, "interactive")]


def parked_and_approved(rt: Runtime, prefix: str) -> str:
    """An rt.approver turn parked on its write tool, the approval decided: its resume is next."""
    from stepq.engine.decisions import decide_approval
    from stepq.engine.runner import StepRunner
    from stepq.models import EventType
    from stepq.turns.submit import create_turn

    state, _ = create_turn(rt, "rt.approver", prompt="go", metadata={"prefix": prefix})
    assert StepRunner(rt).deliver(state.turn_id, 0).action == "none"  # parked on a real approval
    [request] = [e for e in rt.events.read(state.turn_id) if e.type == EventType.APPROVAL_REQUEST]
    approval_id = request.data["approval_id"]
    assert decide_approval(rt, approval_id, rt.approvals.get(approval_id).token, True).accepted
    return state.turn_id


@pytest.mark.parametrize("policy", ["pin", "fail", "continue"])
def test_each_upgrade_policy_when_the_tool_a_turn_waits_on_was_removed(rt: Runtime, prefix: str, policy: str) -> None:
    """The resume's delivery under a definition without the approved call's tool, on the real step path's check."""
    from stepq.engine import upgrade
    from stepq.engine.context import StepContext
    from stepq.engine.emitter import StepEmitter
    from stepq.store.turns import StepStart

    turn_id = parked_and_approved(rt, prefix)
    agent = rt.agents.get("rt.approver")
    assert agent is not None
    old = version_of(agent)
    new = agent.model_copy(update={"allowed_tools": ["rt_echo"], "on_incompatible_upgrade": policy})
    token = rt.leases.new_token()
    start = rt.turns.begin_step(turn_id, 0, token, rt.leases.ttl_ms)
    assert isinstance(start, StepStart) and start.state is not None
    assert start.state.agent_version == old  # recorded by the first step, with the turn's state
    lease = rt.leases.adopt(turn_id, token)
    emitter = StepEmitter(rt.events, turn_id, 0, 0.005)
    ctx = StepContext(rt=rt, state=start.state, lease=lease, emitter=emitter, agent=new)
    decision = upgrade.check(ctx, new)
    rt.leases.release(lease)
    stored = rt.turns.load(turn_id)
    assert stored is not None
    removed = "tool rt_side_effect was removed, and the turn has a pending approval (call "
    if policy == "pin":
        assert decision is not None and (decision.action, decision.step) == ("next", 0)
        assert decision.queue == fingerprint_queue(rt.settings, "rt.approver", old.fingerprint)
        assert stored.pin is not None and stored.pin.through_step == 0 and removed in stored.pin.reason
        assert stored.agent_version == old
    elif policy == "fail":
        assert decision is not None and stored.status == TurnStatus.FAILED and stored.error is not None
        assert stored.error.startswith(
            f"agent rt.approver changed incompatibly for this turn between its steps ({old.short}"
        )
        assert removed in stored.error
    else:
        assert decision is None  # the step runs here, on the new definition (its commit records it)
        assert ctx.state.agent_version == version_of(new) and ctx.state.started_fingerprint == old.fingerprint


def test_a_compatible_change_moves_the_turn_at_the_step_boundary(rt: Runtime, prefix: str) -> None:
    from stepq.engine import upgrade
    from stepq.engine.context import StepContext
    from stepq.engine.emitter import StepEmitter
    from stepq.store.turns import StepStart

    turn_id = parked_and_approved(rt, prefix)
    agent = rt.agents.get("rt.approver")
    assert agent is not None
    new = agent.model_copy(update={"system_prompt": "Other words.", "prompt_version": "p2"})
    token = rt.leases.new_token()
    start = rt.turns.begin_step(turn_id, 0, token, rt.leases.ttl_ms)
    assert isinstance(start, StepStart) and start.state is not None
    lease = rt.leases.adopt(turn_id, token)
    ctx = StepContext(
        rt=rt, state=start.state, lease=lease, emitter=StepEmitter(rt.events, turn_id, 0, 0.005), agent=new
    )
    assert upgrade.check(ctx, new) is None
    rt.leases.release(lease)
    assert ctx.state.agent_version == version_of(new) and ctx.state.pin is None


def test_drain_refuses_what_is_not_a_fingerprint_in_one_line(settings: Settings) -> None:
    done = stepq(settings_env(settings), "drain", "--agent", "rt.basic", "--fingerprint", "not-hex", check=2)
    assert done.stderr.strip().splitlines() == [
        "stepq: error: --fingerprint 'not-hex' is not a fingerprint: 6 to 64 hex digits, as `stepq status` shows"
    ]


def test_drain_of_a_definition_nothing_runs_under_exits_0(settings: Settings) -> None:
    done = stepq(
        settings_env(settings), "drain", "--agent", "rt.basic", "--fingerprint", "0123456789ab", "--json", check=0
    )
    report = json.loads(done.stdout)
    assert report["drained"] is True and report["needs"] == [] and report["queue_depth"] == 0
    assert report["queue"] == f"{settings.queue}.fp.rt.basic.0123456789ab"
