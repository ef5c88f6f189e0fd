"""Celery signal handlers of a worker *program* (`celery worker` / `stepq worker`): logs, /metrics, heartbeat,
and a `-B` beat child that dies with its worker.

`celeryd_init` fires only in a worker program (not in embedded or test workers started in-process), so the
handlers below act only when it named one of our apps. Connected once per process, strongly referenced.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from celery import signals

from stepq.config.settings import Settings
from stepq.fleet.heartbeat import HEARTBEAT_INTERVAL_S, Heartbeat
from stepq.fleet.metrics import PROCESS_POOLS
from stepq.fleet.protocol import broker_sized_for, worker_queues
from stepq.fleet.runtime import get_runtime
from stepq.fleet.versions import served_agents, served_queues
from stepq.logging import install_on_logger
from stepq.providers.registry import preload
from stepq.store.connection import get_redis
from stepq.workers.lifeline import die_with_parent
from stepq.workers.log_filters import quiet_routine_tasks
from stepq.workers.metrics_server import MetricsServer, child_exited, remove_owned_dir

log = logging.getLogger("stepq.worker")


@dataclass
class _Program:
    settings: Settings
    server: MetricsServer | None = None
    heartbeat: Heartbeat | None = None
    pid: int = field(default_factory=os.getpid)  # the worker's main process (a beat child is forked from it)


_program: _Program | None = None


def _settings_of(conf: Any) -> Settings | None:
    value = getattr(conf, "stepq_settings", None)
    return value if isinstance(value, Settings) else None


def _on_celeryd_init(
    sender: Any = None, instance: Any = None, conf: Any = None, options: dict[str, Any] | None = None, **_: Any
) -> None:
    global _program
    settings = _settings_of(conf)
    if settings is not None:
        _program = _Program(settings)
        # before the consumer connects: its channel's pool must hold every task's ack at once (gevent)
        concurrency = (options or {}).get("concurrency") or conf.worker_concurrency or os.cpu_count() or 1
        conf.broker_transport_options = broker_sized_for(
            dict(conf.broker_transport_options or {}), str(conf.broker_url or ""), int(concurrency)
        )


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Any worker of our app (a program, or one started in-process): load the agents and import the
    provider SDKs they name before the first task (a prefork pool's children inherit them)."""
    settings = _settings_of(getattr(getattr(sender, "app", None), "conf", None))
    if settings is None:
        return
    rt = get_runtime(settings)
    if settings.approval_secret is None:
        _signer = rt.signer  # a generated secret is announced (with the command to set one) at start, not at first use
    agents = rt.agents
    named = [*agents.named_providers(), settings.provider or "", *(f.provider for f in settings.fallbacks)]
    named += [m.provider or "" for m in settings.module_models.values()]
    loaded = preload(named)
    if loaded:
        log.info("provider adapters loaded: %s", ", ".join(loaded))


def _on_celeryd_after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """A worker program also consumes the queue of each agent definition it loads (`fingerprint_queue`):
    the steps of turns pinned to exactly these definitions (see stepq.engine.upgrade) reach only such workers."""
    app = getattr(instance, "app", None)
    settings = _settings_of(getattr(app, "conf", None))
    if settings is None or app is None:
        return
    for queue in served_queues(settings, get_runtime(settings).agents):
        app.amqp.queues.select_add(queue)


def _on_beat_embedded_init(**_: Any) -> None:
    """In the `-B` beat child: end with the worker, even a SIGKILLed one (no orphan keeps sweeping)."""
    if _program is not None:
        die_with_parent(_program.pid)


def _on_setup_logger(logger: logging.Logger | None = None, **_: Any) -> None:
    if _program is not None and logger is not None:
        install_on_logger(logger, _program.settings)
        quiet_routine_tasks(logger)


def _pool_name(pool: Any) -> str:
    """`prefork`, `threads`, `solo`…, from the pool instance Celery started."""
    from celery.concurrency.prefork import TaskPool as PreforkPool
    from celery.concurrency.thread import TaskPool as ThreadPool

    if isinstance(pool, PreforkPool):
        return "prefork"
    if isinstance(pool, ThreadPool):
        return "threads"
    return type(pool).__module__.rsplit(".", 1)[-1]


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    program = _program
    if program is None or sender is None or _settings_of(sender.app.conf) is not program.settings:
        return
    s = program.settings
    pool = _pool_name(getattr(sender, "pool", None))
    program.server = MetricsServer(s)
    program.server.start(process_pool=pool in PROCESS_POOLS)
    controller = getattr(sender, "controller", None)
    started = time.time()
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) or worker_queues(s)
    served = served_agents(get_runtime(s).agents)

    def info() -> dict[str, Any]:
        from celery.worker import state as worker_state

        return {
            "hostname": sender.hostname,
            "pid": os.getpid(),
            "pool": pool,
            "concurrency": getattr(controller, "concurrency", None),
            "queues": queues,
            "active": len(worker_state.active_requests),
            "metrics_port": program.server.port if program.server else None,
            "started_at": round(started, 3),
            "agents": served,  # agent id -> the fingerprint and version it runs (`stepq status`, `stepq drain`)
        }

    program.heartbeat = Heartbeat(get_redis(s), s.state_prefix, sender.hostname, info, HEARTBEAT_INTERVAL_S)
    program.heartbeat.start()
    # Everything loaded so far (modules, agents, SDKs) moves out of the collector's reach: a full collection
    # then scans only what steps allocate. Without it, full collections stalled a worker with 200 steps
    # streaming for 90-120 ms each (every step waits meanwhile); forked pool children also share the pages.
    gc.freeze()


def _on_worker_process_init(**_: Any) -> None:
    if _program is not None and _program.server is not None:
        _program.server.close_inherited()  # a child forked after the server started
    if _program is not None:
        _program.heartbeat = None  # its thread lives in the parent only
        # a prefork child must not outlive a SIGKILLed worker either (the pool may fork it from a helper thread)
        die_with_parent(_program.pid, forked_by_main_thread=False)


def _on_worker_process_shutdown(pid: int | None = None, **_: Any) -> None:
    if _program is not None:
        child_exited(pid or os.getpid())


def _on_worker_shutdown(**_: Any) -> None:
    program = _program
    if program is None:
        return
    if program.heartbeat is not None:
        program.heartbeat.stop()
    if program.server is not None:
        program.server.stop()
    remove_owned_dir()


_connected = False


def install_signals() -> None:
    """Connect the handlers (idempotent: every app created in a process shares them)."""
    global _connected
    if _connected:
        return
    _connected = True
    signals.celeryd_init.connect(_on_celeryd_init, weak=False)
    signals.worker_init.connect(_on_worker_init, weak=False)
    signals.after_setup_logger.connect(_on_setup_logger, weak=False)
    signals.after_setup_task_logger.connect(_on_setup_logger, weak=False)
    signals.worker_ready.connect(_on_worker_ready, weak=False)
    signals.worker_process_init.connect(_on_worker_process_init, weak=False)
    signals.worker_process_shutdown.connect(_on_worker_process_shutdown, weak=False)
    signals.worker_shutdown.connect(_on_worker_shutdown, weak=False)
    signals.celeryd_after_setup.connect(_on_celeryd_after_setup, weak=False)
    signals.beat_embedded_init.connect(_on_beat_embedded_init, weak=False)
