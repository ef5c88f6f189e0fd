"""The worker process's one event loop for provider HTTP, on a daemon thread of its own.

Hundreds of streaming steps each blocked in a socket read cost a thread wake-up, a GIL hand-off and
httpx's per-chunk layers for every delta; one loop reading every stream (with a C HTTP parser, see
`loop_transport`) does the same work for a fraction of the CPU (docs/contributing/stream-decoding.md).
The loop starts on first use, in the process that uses it: a prefork child gets its own after the fork
(the parent's thread does not exist there). Under gevent's monkey-patching a "thread" is a greenlet and
a loop running in one would block the hub, so there is no loop (`running()` is None) and callers keep
the blocking path.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class _Loop:
    pid: int
    loop: asyncio.AbstractEventLoop
    thread_id: int


_current: _Loop | None = None
_start_lock = threading.Lock()


def gevent_patched() -> bool:
    """True when gevent monkey-patched this process's sockets (the `gevent` worker pool)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("socket"))


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # optional C loop (the provider extras install it): half the CPU per read
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def running() -> asyncio.AbstractEventLoop | None:
    """This process's provider loop (started now if needed), or None under gevent."""
    current = _current
    if current is not None and current.pid == os.getpid():
        return current.loop
    if gevent_patched():
        return None
    return _start().loop


def _start() -> _Loop:
    global _current
    with _start_lock:
        current = _current
        if current is not None and current.pid == os.getpid():
            return current
        loop = _new_loop()
        ready = threading.Event()
        ident: list[int] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            ident.append(threading.get_ident())
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, name="stepq-provider-io", daemon=True).start()
        ready.wait()
        _current = _Loop(os.getpid(), loop, ident[0])
        return _current


def _forget_in_child() -> None:
    """After a fork the parent's loop thread is gone (and its thread id may be reused): start afresh."""
    global _current, _start_lock
    _current = None
    _start_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_in_child)


def in_loop_thread() -> bool:
    """True on the provider loop's own thread: code there must never block (it reads every stream)."""
    current = _current
    return current is not None and current.thread_id == threading.get_ident()
