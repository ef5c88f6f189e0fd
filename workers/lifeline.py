"""A helper process that must not outlive the worker that forked it (the `-B` beat scheduler).

A worker killed with SIGKILL runs no shutdown code, so its beat child would live on, an orphan that
keeps scheduling sweeps for a worker that is gone. On Linux the kernel ends the child instead
(prctl PR_SET_PDEATHSIG); elsewhere a daemon thread notices the parent change and exits.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("stepq.worker")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 1.0


def die_with_parent(parent_pid: int, *, forked_by_main_thread: bool = True) -> None:
    """End this process when `parent_pid` (the process that forked it) dies, however it dies.

    The kernel's signal fires when the *thread* that forked us ends, so it is used only for a child forked
    by the parent's main thread; a child forked by a helper thread (a pool supervisor) polls instead."""
    if forked_by_main_thread and sys.platform.startswith("linux") and _pdeathsig(signal.SIGTERM):
        if os.getppid() != parent_pid:  # it died before the kernel was told to watch
            os._exit(0)
        return
    threading.Thread(target=_watch, args=(parent_pid,), name="stepq-lifeline", daemon=True).start()


def _pdeathsig(sig: signal.Signals) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
            return True
        log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("prctl unavailable (%s): watching the parent process instead", exc)
    return False


def _watch(parent_pid: int) -> None:
    stop = threading.Event()
    while not stop.wait(POLL_S):
        if os.getppid() != parent_pid:
            os._exit(0)
