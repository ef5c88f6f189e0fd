"""What producers and workers agree on without importing each other: task names and Celery settings.

This module builds plain dicts and does not import Celery, so the library layer stays free of it.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

from typing import Any

from stepq.config.settings import Settings
from stepq.store.connection import SENTINEL_SCHEME, kombu_sentinel_broker
from stepq.store.keys import Keys

REDIS_BROKER_SCHEMES = ("redis://", "rediss://", "unix://", "sentinel://")

RUN_STEP = "stepq.run_step"
APPROVE = "stepq.approve"
SWEEP = "stepq.sweep"
BATCH_DRIVE = "stepq.batch_drive"
PROVIDER_BATCH_TICK = "stepq.provider_batch_tick"


def run_step_message(turn_id: str, step: int, attempt: int | None = None) -> dict[str, Any]:
    """`send_task` arguments of a run_step message: args, kwargs and their display forms (the `argsrepr` /
    `kwargsrepr` headers), given so Celery does not saferepr them on every send (~80 us of CPU per step)."""
    args = [turn_id, step]
    kwargs = {"attempt": attempt} if attempt is not None else None
    return {"args": args, "kwargs": kwargs, "argsrepr": repr(args), "kwargsrepr": repr(kwargs or {})}


def send_options(settings: Settings) -> dict[str, Any]:
    """`send_task` options for a run_step message. On a Redis broker, `declare=[]`: the message goes to the queue's
    list by name (exchange ''), which needs no declaring (a worker declares the queues it consumes), and kombu's
    per-send check that the queue was declared costs ~100 us of CPU. Other brokers declare as Celery does (an AMQP
    message sent to a queue nobody declared yet would be dropped)."""
    redis_broker = settings.effective_broker_url.startswith((*REDIS_BROKER_SCHEMES, SENTINEL_SCHEME))
    return {"declare": []} if redis_broker else {}


def broker_is_store(settings: Settings) -> bool:
    """Whether Celery's broker is the store's own Redis (a Redis URL, no STEPQ_BROKER_URL): then a message can be
    pushed by the script that stores what it is about (stepq.fleet.broker_capture)."""
    return not settings.embedded and not settings.broker_url and not settings.redis_cluster


def queue_for(settings: Settings, priority: str) -> str:
    """Interactive turns and batch turns go to separate queues, so a big batch never delays a chat."""
    return f"{settings.queue}.batch" if priority == "batch" else settings.queue


def fingerprint_queue(settings: Settings, agent_id: str, fingerprint: str) -> str:
    """The queue of the steps that need this definition of the agent (a pinned turn's, see engine/upgrade.py):
    every worker that loads it consumes it, beside the shared queues, so only those workers take them."""
    return f"{settings.queue}.fp.{agent_id}.{fingerprint[:12]}"


def worker_queues(settings: Settings) -> list[str]:
    """What a worker serves by default, most urgent first (the Redis transport honours this order)."""
    return [settings.queue, f"{settings.queue}.batch"]


def publish_retry_policy(settings: Settings) -> dict[str, Any]:
    """kombu's publish retry covering the outage window (its default gives up after about half a second)."""
    interval_max = 1.0
    return {
        "max_retries": max(3, int(settings.redis_outage_s / interval_max) + 3),
        "interval_start": 0.0,
        "interval_step": 0.2,
        "interval_max": interval_max,
    }


KOMBU_REDIS_CONNECTIONS = 10  # kombu's Redis transport: its channel's connection pool (`max_connections`)


def broker_sized_for(conf_transport: dict[str, Any], broker_url: str, concurrency: int) -> dict[str, Any]:
    """A worker's Redis broker options for `concurrency` tasks at once. Under gevent (and eventlet) each task acks
    from its own greenlet through the consumer channel's connection pool, and redis-py's pool raises rather than
    waits: with kombu's 10 connections, the 11th ack of steps ending together failed ("Couldn't ack ...
    MaxConnectionsError"), the message stayed unacked until the visibility timeout, and a streaming worker
    took no more work. One connection per task plus kombu's own; a `max_connections` set in
    `STEPQ_BROKER_TRANSPORT_OPTIONS` stands. Connections open only when used (a threads worker's acks are
    the consumer's, one at a time)."""
    if not broker_url.startswith(REDIS_BROKER_SCHEMES) or "max_connections" in conf_transport:
        return conf_transport
    return {**conf_transport, "max_connections": KOMBU_REDIS_CONNECTIONS + max(concurrency, 0)}


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for at-least-once steps: late acks, requeue on worker loss, prefetch 1, JSON only."""
    url = settings.effective_broker_url
    transport: dict[str, Any] = {}
    if url.startswith(SENTINEL_SCHEME):  # the broker on the same Sentinels, in kombu's spelling
        url, transport = kombu_sentinel_broker(url)
    if url.startswith(REDIS_BROKER_SCHEMES):
        transport.update(
            visibility_timeout=settings.visibility_timeout_s,
            global_keyprefix=Keys(settings.key_prefix).broker_prefix,
            queue_order_strategy="priority",  # drain the interactive queue before the batch queue
        )
    elif url.startswith("memory://"):
        transport = {"polling_interval": settings.memory_polling_interval_s}
    if url.startswith(REDIS_BROKER_SCHEMES):
        # bounded socket waits, so a stalled broker connection is noticed and re-established
        transport.update(socket_timeout=settings.redis_socket_timeout_s, socket_connect_timeout=5.0)
    transport.update(settings.broker_transport_options)
    return {
        "broker_url": url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a worker waits out a broker outage of any length
        # AMQP heartbeats every 10 s: a half-open connection (a dead host, a partition) is noticed within
        # ~30 s on both sides, and RabbitMQ requeues the unacked step at once (the 120 s default took minutes)
        "broker_heartbeat": 10,
        # sending a task (the next step, a retry) waits out a broker outage instead of failing the step
        "task_publish_retry_policy": publish_retry_policy(settings),
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "result_backend": None,
        "task_default_queue": settings.queue,
        "task_create_missing_queues": True,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "beat_schedule": {
            "stepq-sweep": {"task": SWEEP, "schedule": settings.sweep_interval_s, "options": {"queue": settings.queue}},
            "stepq-provider-batch": {
                "task": PROVIDER_BATCH_TICK,
                "schedule": settings.provider_batch_poll_s,
                "options": {"queue": queue_for(settings, "batch")},
            },
        },
    }
