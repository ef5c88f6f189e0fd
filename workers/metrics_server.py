"""The worker's `/metrics` endpoint, in one process for thread pools and in the parent for prefork.

- threads / solo: the process-wide registry is served as is (plus the scrape-time state gauges).
- prefork: children run the steps, so their metrics live in prometheus_client's multiprocess files
  under `PROMETHEUS_MULTIPROC_DIR` (which `stepq worker --pool=prefork` sets before exec'ing celery);
  the parent serves a `MultiProcessCollector` over them. The server starts once the pool is up
  (`worker_ready`), and a child forked later closes its inherited copy of the listening socket.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from stepq.config import Settings
from stepq.metrics import MULTIPROC_ENV, OWNED_MARKER, StateCollector

log = logging.getLogger("stepq.metrics")


def multiprocess_dir() -> str | None:
    """Set when prometheus_client runs in multiprocess mode (it reads the same variable at import)."""
    return os.environ.get(MULTIPROC_ENV) or None


class _Forward(Collector):
    """Serves the process-wide default registry from our own registry (which adds the state gauges)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


def build_registry(settings: Settings) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    path = multiprocess_dir()
    if path:
        MultiProcessCollector(registry, path=path)
    else:
        registry.register(_Forward(REGISTRY))
    registry.register(StateCollector(settings))
    return registry


class MetricsServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.httpd: WSGIServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        return self.httpd.server_address[1] if self.httpd is not None else None

    def start(self, process_pool: bool) -> bool:
        """Listen on `metrics_host:metrics_port` (0: disabled). A busy port is logged, not fatal."""
        s = self.settings
        if not s.metrics_port:
            return False
        if process_pool and not multiprocess_dir():
            log.warning(
                "prefork pool without %s: /metrics shows only the parent process, not the children that run "
                "steps; start it with `stepq worker --pool=prefork` or set %s to an empty directory",
                MULTIPROC_ENV,
                MULTIPROC_ENV,
            )
        try:
            self.httpd, self.thread = start_http_server(s.metrics_port, addr=s.metrics_host, registry=build_registry(s))
        except OSError as exc:
            log.error("cannot serve /metrics on %s:%s: %s", s.metrics_host, s.metrics_port, exc)
            return False
        log.info("serving /metrics on %s:%s", s.metrics_host, s.metrics_port)
        return True

    def close_inherited(self) -> None:
        """In a forked child: close the copy of the listening socket (the parent keeps serving)."""
        if self.httpd is not None:
            self.httpd.socket.close()
        self.httpd = self.thread = None

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.httpd = self.thread = None


def child_exited(pid: int) -> None:
    """prometheus_client's bookkeeping for a dead child (drops its live-gauge files; counters stay)."""
    path = multiprocess_dir()
    if path:
        mark_process_dead(pid, path)


def remove_owned_dir() -> None:
    """Delete the multiprocess directory on shutdown if `stepq worker` created it."""
    path = multiprocess_dir()
    if path and os.path.exists(os.path.join(path, OWNED_MARKER)):
        shutil.rmtree(path, ignore_errors=True)
