"""Recovery after kill -9: how long a turn waits for a new worker, and what runs twice.

For each broker (Redis, RabbitMQ), three `celery worker` processes (threads pool, each with the sweeper's
beat, as `stepq worker` runs them) serve turns of `bench.recovery`: a streamed answer, a read-only and a
mutation tool (approved as soon as it asks), another streamed answer. For each of N turns the benchmark waits a random time after the
submit, SIGKILLs the worker running the turn, starts a replacement, and measures the recovery time:
from the kill to the first event any worker writes for that turn afterwards (event timestamps; one host,
one clock). It then counts tool executions: extra runs of read-only and of mutation tools, and runs of
a tool whose result was already stored (which must be 0). Settings are stepq's defaults.

    .venv/bin/python -m bench.recovery --turns 10          # ~5 min

Exits 0 when p99 recovery <= 10 s on every broker and no stored tool ran again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis

from bench._common import DEFAULT_REDIS_URL, ROOT, bench_settings, cleanup, positive_count, settings_env, unique_prefix
from bench.recovery_agents import counter_key
from stepq.config.settings import Settings
from stepq.fleet.protocol import worker_queues
from stepq.models import Event, EventType

DEFAULT_AMQP_URL = os.environ.get("STEPQ_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
TARGET_P99_S = 10.0


class Worker:
    def __init__(self, settings: Settings, name: str) -> None:
        schedule = os.path.join(tempfile.mkdtemp(prefix="stepq-bench-beat-"), "schedule")
        cmd = [
            sys.executable, "-m", "celery", "-A", "stepq.workers.celery_app", "worker", "--pool=threads",
            "--concurrency=2", "--loglevel=ERROR", "-Q", ",".join(worker_queues(settings)),
            "--without-gossip", "--without-mingle", f"--hostname={name}@%h", "-B", "--schedule", schedule,
        ]  # fmt: skip
        env = settings_env(settings)
        env["STEPQ_METRICS_PORT"] = "0"
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class Sample:
    recovery_s: float | None = None  # None: the turn ended before the kill
    extra_runs: dict[str, int] = field(default_factory=lambda: {"read": 0, "write": 0})
    after_stored: int = 0
    completed: bool = False


def _follow(client: Any, handle: Any, seen: list[Event], done: threading.Event) -> None:
    """Collect the turn's events; approve its mutation as soon as it is asked for (a reviewer's click)."""
    try:
        for event in handle.events(idle_timeout=180):
            seen.append(event)
            if event.type == EventType.APPROVAL_REQUEST:
                approval_id = event.data["approval_id"]
                threading.Thread(target=_approve, args=(client, approval_id), daemon=True).start()
    finally:
        done.set()


def _approve(client: Any, approval_id: str) -> None:
    """Approve like a reviewer's UI: a decision nobody confirmed (the worker that took it was killed) is sent
    again; one already recorded is refused as not-pending, which ends it."""
    from stepq.errors import ApprovalError

    for _ in range(20):
        try:
            client.approve(approval_id, True, reviewer="bench").wait(timeout=10)
            return
        except ApprovalError:
            return
        except TimeoutError:
            continue


def _running_pid(seen: list[Event]) -> int | None:
    starts = [e for e in seen if e.type == EventType.STEP_START]
    if not starts or any(e.type == EventType.TURN_FINISH for e in seen):
        return None
    return int(str(starts[-1].data["worker"]).rsplit(":", 1)[1])


def one_turn(client: Any, settings: Settings, workers: list[Worker], kill_after: float | None) -> Sample:
    handle = client.submit(
        "bench.recovery", prompt="go", metadata={"prefix": settings.key_prefix, "redis_url": settings.redis_url}
    )
    seen: list[Event] = []
    done = threading.Event()
    threading.Thread(target=_follow, args=(client, handle, seen, done), daemon=True).start()
    sample = Sample()
    victim = None
    if kill_after is not None:
        time.sleep(kill_after)  # a random point of the turn (a benchmark's fault injection)
        pid = _running_pid(list(seen))
        victim = next((w for w in workers if w.proc.pid == pid), None)
    killed_at = None
    if victim is not None:
        killed_at = time.time()
        victim.kill()
        workers[workers.index(victim)] = Worker(settings, f"r{uuid.uuid4().hex[:6]}")
    result = handle.wait(timeout=300)
    done.wait(timeout=60)
    sample.completed = result.status.value == "completed"
    if killed_at is not None:
        later = [e.ts for e in seen if e.ts > killed_at]
        sample.recovery_s = (min(later) - killed_at) if later else None
    r = redis.Redis.from_url(settings.redis_url or DEFAULT_REDIS_URL, decode_responses=True)
    for kind in ("read", "write"):
        started = int(r.get(counter_key(settings.key_prefix, handle.turn_id, kind, "started")) or 0)
        sample.extra_runs[kind] = max(0, started - 1)
        sample.after_stored += int(r.get(counter_key(settings.key_prefix, handle.turn_id, kind, "after-stored")) or 0)
    r.close()
    return sample


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run_broker(name: str, redis_url: str, broker_url: str | None, turns: int, rng: random.Random) -> dict[str, Any]:
    from stepq.producer.client import Client

    prefix = unique_prefix(f"rec-{name}")
    settings = bench_settings(
        redis_url, prefix, broker_url=broker_url, agent_modules=["bench.recovery_agents"], metrics_port=0
    )
    workers = [Worker(settings, f"w{i}") for i in range(3)]
    samples: list[Sample] = []
    try:
        client = Client(settings)
        one_turn(client, settings, workers, None)  # warm-up while the workers finish starting
        started = time.monotonic()
        one_turn(client, settings, workers, None)  # no kill: how long an undisturbed turn takes
        duration = time.monotonic() - started
        attempts = 0
        while sum(s.recovery_s is not None for s in samples) < turns and attempts < 3 * turns:
            attempts += 1
            sample = one_turn(client, settings, workers, rng.uniform(0.05, 0.9) * duration)
            samples.append(sample)
            shown = f"{sample.recovery_s:.2f} s" if sample.recovery_s is not None else "no kill (turn had ended)"
            print(f"  {name} turn {attempts}: recovery {shown}, completed={sample.completed}", flush=True)
    finally:
        for w in workers:
            w.stop()
        cleanup(redis_url, prefix)
        if broker_url and broker_url.startswith("amqp"):
            _delete_amqp_queues(broker_url, settings)
    times = [s.recovery_s for s in samples if s.recovery_s is not None]
    return {
        "broker": name,
        "kills": len(times),
        "p50": percentile(times, 0.5) if times else float("nan"),
        "p99": percentile(times, 0.99) if times else float("nan"),
        "max": max(times) if times else float("nan"),
        "completed": sum(s.completed for s in samples),
        "turns": len(samples),
        "extra_read": sum(s.extra_runs["read"] for s in samples),
        "extra_write": sum(s.extra_runs["write"] for s in samples),
        "after_stored": sum(s.after_stored for s in samples),
    }


def _delete_amqp_queues(url: str, settings: Settings) -> None:
    from kombu import Connection

    with Connection(url) as conn:
        channel = conn.channel()
        for queue in (settings.queue, f"{settings.queue}.batch"):
            with contextlib.suppress(Exception):
                channel.queue_delete(queue)
                channel.exchange_delete(queue)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=positive_count, default=10, help="turns (one kill each) per broker")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL, help="RabbitMQ broker ('' skips it)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.turns <= 500:
        parser.error("--turns must be between 1 and 500")
    rng = random.Random(args.seed)
    rows = [run_broker("redis", args.redis_url, None, args.turns, rng)]
    if args.amqp_url:
        rows.append(run_broker("rabbitmq", args.redis_url, args.amqp_url, args.turns, rng))
    print()
    print("| broker | kills | recovery p50 | p99 | max | turns completed | extra read-only runs | extra mutation runs "
          "| runs after result stored |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['broker']} | {r['kills']} | {r['p50']:.2f} s | {r['p99']:.2f} s | {r['max']:.2f} s "
            f"| {r['completed']}/{r['turns']} | {r['extra_read']} | {r['extra_write']} | {r['after_stored']} |"
        )
    ok = all(r["p99"] <= TARGET_P99_S and r["after_stored"] == 0 and r["completed"] == r["turns"] for r in rows)
    print(f"\ntarget p99 <= {TARGET_P99_S:.0f} s, 0 runs after a stored result, every turn completed: "
          f"{'met' if ok else 'NOT met'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
