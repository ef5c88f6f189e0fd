"""`ToolContext.run_process`: a subprocess a tool starts, killed when its call is cancelled.

Python cannot stop a running thread, but it can kill a process: a tool that does its work in a
subprocess through this helper stops doing it the moment its call times out or its turn is cancelled,
and its thread is free again right after. The process gets its own session, so the kill reaches its
children too (the whole process group).

Internal (not part of the `stepq` API; tools call it as `ctx.run_process`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from stepq.cancel import CancelSignal, ToolCancelledError


def run_process(
    cancelled: CancelSignal,
    args: Sequence[str],
    *,
    input: str | None = None,
    timeout_s: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `args` to completion (text stdout/stderr captured). Raises ToolCancelledError when the call was
    cancelled (the process group is killed), subprocess.TimeoutExpired past `timeout_s`, and with `check`,
    subprocess.CalledProcessError on a non-zero exit."""
    if cancelled.is_set():
        raise ToolCancelledError("not started: the tool call was already cancelled")
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,  # its own process group: the kill reaches its children too
    )
    unsubscribe = cancelled.on_set(lambda: _kill(proc))
    try:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            raise
    finally:
        unsubscribe()
    if cancelled.is_set():
        raise ToolCancelledError(f"process {args[0]!r} killed: the tool call was cancelled")
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(args), stdout, stderr)
    return subprocess.CompletedProcess(list(args), proc.returncode, stdout, stderr)


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
