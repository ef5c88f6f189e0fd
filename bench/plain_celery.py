"""The plain Celery hop: Celery's defaults plus `acks_late` and prefetch 1, and nothing of stepq.

No `stepq.fleet.protocol.celery_config`, no stepq signals, bootsteps or imports: the floor a step is
compared with, so a cost added to the worker's Celery setup (in `bench.celery_app`'s stepq-configured hop)
shows up against it. The one extra setting is the broker's `global_keyprefix`, which only names the
broker's keys under the run's prefix (so runs can share a Redis and the run can delete its keys).

Two tasks: `noop`, the hop `bench.step_overhead` compares a step with, and `stream`, the Anthropic SDK called
from a plain task that publishes each text delta on Redis pub/sub as it arrives (no store, no lease, no
coalescing): the least a Celery-based streaming design does, which `bench.provider_ttfc` times beside a stepq
turn and the SDK called directly.

`celery -A bench.plain_celery worker` builds the app from `STEPQ_BENCH_PLAIN_{REDIS_URL,PREFIX}`; the
benchmark process builds the same app with `build_plain_app` to send the first task.

`python -m bench.plain_celery bare REDIS_URL PREFIX PROMPT` is the same `stream` body without Celery: one thread
BRPOPs run ids from a Redis list and streams each answer (`bare_worker`). It is the floor of *any* design that
hands a call to a worker process through Redis and fans its chunks out through pub/sub (one push, one pop, one
publish per chunk), over which `bench.provider_ttfc` shows what Celery's own send and consumer add.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anthropic
import redis
from anthropic.types import RawMessageStreamEvent
from celery import Celery

PLAIN_NOOP = "bench.plain.noop"
PLAIN_STREAM = "bench.plain.stream"


def plain_queue(prefix: str) -> str:
    return f"{prefix}.plain"


def plain_done_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:bench:plain-done:{run_id}"


def plain_channel(prefix: str, run_id: str) -> str:
    """Where the `stream` task publishes: the pattern `{prefix}:turn:*:ch` a stepq turn's events match too."""
    return f"{prefix}:turn:{run_id}:ch"


def open_answer_stream(sdk: anthropic.Anthropic, prompt: str) -> anthropic.Stream[RawMessageStreamEvent]:
    """The streamed Messages request the SDK sides of `bench.provider_ttfc` make (the plain task, the direct call)."""
    return sdk.messages.create(
        model="claude-bench",
        max_tokens=1024,
        system="benchmark",
        messages=[{"role": "user", "content": prompt}],
        stream=True,
    )


def bare_queue(prefix: str) -> str:
    """The Redis list `bare_worker` pops run ids from (a plain list: no broker, no message envelope)."""
    return f"{prefix}:bench:bare"


def stream_answer(sdk: anthropic.Anthropic, publisher: redis.Redis, prefix: str, run_id: str, prompt: str) -> None:
    """Stream one answer: PUBLISH each text delta as it arrives, then a `turn-finish` (the plain task's body)."""
    channel = plain_channel(prefix, run_id)
    with open_answer_stream(sdk, prompt) as events:
        for event in events:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                delta = {"type": "text-delta", "turn_id": run_id, "data": {"text": event.delta.text}}
                publisher.publish(channel, json.dumps(delta))
    publisher.publish(channel, json.dumps({"type": "turn-finish", "turn_id": run_id}))


def bare_worker(redis_url: str, prefix: str, prompt: str) -> None:
    """Pop run ids from `bare_queue` and stream each answer, until the process is stopped (no Celery, no
    message envelope: the run id is the whole message)."""
    client = redis.Redis.from_url(redis_url)
    sdk = anthropic.Anthropic(max_retries=0)  # from ANTHROPIC_BASE_URL / _API_KEY, as the plain task's
    while True:
        popped = client.brpop([bare_queue(prefix)])
        if popped:
            run_id = popped[1]
            stream_answer(sdk, client, prefix, run_id.decode() if isinstance(run_id, bytes) else run_id, prompt)


def build_plain_app(redis_url: str, prefix: str) -> Celery:
    app = Celery("bench-plain", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"global_keyprefix": f"{prefix}."},  # key names only
    )
    queue = plain_queue(prefix)
    done = redis.Redis.from_url(redis_url)

    @app.task(name=PLAIN_NOOP)
    def noop(run_id: str, remaining: int) -> None:
        """Re-enqueue itself, like run_step enqueues the next step; the last one says it is done."""
        if remaining > 1:
            app.send_task(PLAIN_NOOP, args=[run_id, remaining - 1], queue=queue)
        else:
            done.rpush(plain_done_key(prefix, run_id), "done")

    sdk: list[anthropic.Anthropic] = []  # built on the first call, from ANTHROPIC_BASE_URL / _API_KEY

    @app.task(name=PLAIN_STREAM)
    def stream(run_id: str, prompt: str) -> None:
        """Stream one answer: PUBLISH each text delta as it arrives, then a `turn-finish`."""
        if not sdk:
            sdk.append(anthropic.Anthropic(max_retries=0))
        stream_answer(sdk[0], done, prefix, run_id, prompt)

    return app


def __getattr__(name: str) -> Any:
    """`app` is built on first access (by `celery -A bench.plain_celery`), from the environment."""
    if name == "app":
        value = build_plain_app(os.environ["STEPQ_BENCH_PLAIN_REDIS_URL"], os.environ["STEPQ_BENCH_PLAIN_PREFIX"])
        globals()["app"] = value
        return value
    raise AttributeError(name)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "bare":
        sys.exit("usage: python -m bench.plain_celery bare REDIS_URL PREFIX PROMPT")
    bare_worker(sys.argv[2], sys.argv[3], sys.argv[4])
