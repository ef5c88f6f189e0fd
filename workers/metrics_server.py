"""The worker's `/metrics` endpoint, in one process for thread pools and in the parent for prefork.

- threads / solo: the process-wide registry is served as is (plus the scrape-time state gauges).
- prefork: children run the steps, so their metrics live in prometheus_client's multiprocess files
  under `PROMETHEUS_MULTIPROC_DIR` (which `stepq worker --pool=prefork` sets before exec'ing celery);
  the parent serves a `MultiProcessCollector` over them. The server starts once the pool is up
  (`worker_ready`), and a child forked later closes its inherited copy of the listening socket.

Port rule, so several workers share a host: `STEPQ_METRICS_PORT` is a *base*. A worker serves on the
first free port from the base up (at most METRICS_PORT_SPAN ports), logs the port it took and
publishes it in its heartbeat (`stepq status` lists it). `stepq worker --metrics-port N` sets the
base for one worker; 0 turns /metrics off.
"""

from __future__ import annotations

import errno
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

from stepq.config.settings import Settings
from stepq.fleet.metrics import MULTIPROC_ENV, OWNED_MARKER, StateCollector

log = logging.getLogger("stepq.metrics")
METRICS_PORT_SPAN = 32  # ports tried from STEPQ_METRICS_PORT up: workers on one host take one each


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
        """Listen on the first free port from `metrics_port` up (0: disabled). None free is logged, not fatal."""
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
        registry = build_registry(s)
        last = min(s.metrics_port + METRICS_PORT_SPAN - 1, 65535)
        for port in range(s.metrics_port, last + 1):
            try:
                self.httpd, self.thread = start_http_server(port, addr=s.metrics_host, registry=registry)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue  # another worker on this host has it: try the next one
                log.error("cannot serve /metrics on %s:%s: %s", s.metrics_host, port, exc)
                return False
            if port == s.metrics_port:
                log.info("serving /metrics on %s:%s", s.metrics_host, port)
            else:
                log.warning(
                    "serving /metrics on %s:%s (STEPQ_METRICS_PORT=%s is taken, by another worker on this host?)",
                    s.metrics_host, port, s.metrics_port,
                )  # fmt: skip
            return True
        log.error(
            "cannot serve /metrics: ports %s-%s on %s are all in use; set STEPQ_METRICS_PORT (or --metrics-port) "
            "to a free range",
            s.metrics_port, last, s.metrics_host,
        )  # fmt: skip
        return False

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
