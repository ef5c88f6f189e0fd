"""Failures at the command line as one line each: what went wrong and what to do, never a traceback.

Every `stepq` command (and `stepq batch`) ends in `main`'s one handler, which asks `describe` for the
line and the exit code. Exit codes: 1 a service (Redis, the broker) is unreachable or something
unexpected broke, 2 bad input, 130 interrupted, 141 the reader of stdout went away (`… | head`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import kombu.exceptions
import redis

from stepq.config.settings import Settings
from stepq.errors import (
    BrokerUnavailableError,
    StepqError,
    StoreUnavailableError,
    TurnNotFoundError,
    WaitTimeoutError,
    extra_providing,
    install_command,
)
from stepq.logging import redact_url

EMBEDDED_STATE_HINT = (
    "embedded mode (STEPQ_REDIS_URL unset) keeps turns inside the process that ran them; "
    "set STEPQ_REDIS_URL to inspect turns from another command"
)
BROKEN_PIPE_EXIT = 141  # what a shell reports for a process killed by SIGPIPE
INTERRUPTED_EXIT = 130
TRACEBACK_ENV = "STEPQ_TRACEBACK"  # set to 1: unexpected errors show their traceback instead of one line


class UsageError(Exception):
    """Bad command-line input: printed without a traceback, exit code 2."""


def seconds(raw: str) -> float:
    """argparse type of a wait's --timeout / --wait: a number of seconds >= 0 (`inf`: no limit). A NaN or a
    negative one is refused at parse time rather than hanging or reporting a wait 'after -1s'."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{raw!r}: seconds must be 0 or more")
    return value


@dataclass(frozen=True)
class Failure:
    message: str
    code: int


def err(message: str) -> None:
    """One line on stderr, prefixed with the program's name (as argparse does)."""
    print(f"stepq: {message}", file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()).rstrip(".") or type(exc).__name__


def describe(exc: BaseException, settings: Settings | None) -> Failure | None:
    """The line and exit code for an error a user can fix; None for a bug (the caller decides)."""
    if isinstance(exc, UsageError):
        return Failure(_one_line(exc), 2)
    if isinstance(exc, TurnNotFoundError):
        hint = f" ({EMBEDDED_STATE_HINT})" if settings is not None and settings.embedded else ""
        return Failure(f"{_one_line(exc)}{hint}", 2)
    if isinstance(exc, StoreUnavailableError | BrokerUnavailableError | WaitTimeoutError):  # a service down or slow
        return Failure(_one_line(exc), 1)
    if isinstance(exc, StepqError):  # submit, definition (an agent module that fails to import), approval…
        return Failure(_one_line(exc), 2)
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    extra = extra_providing(missing)
    if extra is not None:  # a command reached an extra's module before any check of its own did
        return Failure(f"this command needs the {extra} extra (no module {missing}): {install_command(extra)}", 2)
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        where = f" at {redact_url(settings.redis_url)}" if settings is not None and settings.redis_url else ""
        return Failure(f"cannot reach Redis{where}: {_one_line(exc)}. Is it running, and is STEPQ_REDIS_URL right?", 1)
    if isinstance(exc, kombu.exceptions.OperationalError):
        where = f" at {redact_url(settings.effective_broker_url)}" if settings is not None else ""
        return Failure(
            f"cannot reach the broker{where}: {_one_line(exc)}. Is it running, and are STEPQ_BROKER_URL "
            "(default: STEPQ_REDIS_URL) right?",
            1,
        )
    return None


def unexpected(exc: BaseException) -> Failure:
    """A bug, still on one line; STEPQ_TRACEBACK=1 shows where it happened."""
    return Failure(
        f"unexpected {type(exc).__name__}: {_one_line(exc)} (a bug in stepq; {TRACEBACK_ENV}=1 shows the traceback)",
        1,
    )


def show_tracebacks() -> bool:
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def quiet_broken_pipe() -> int:
    """The reader of stdout went away (`stepq events … | head`): stop without a word.

    stdout now points at /dev/null, so the interpreter's own flush at exit cannot complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE_EXIT


def _quit_now(signum: int, frame: FrameType | None) -> None:
    """The second Ctrl-C: leave at once, without waiting for clean-up (an embedded worker's running step)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(INTERRUPTED_EXIT)


def _first_interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, _quit_now)
    raise KeyboardInterrupt


def interrupt_twice_to_quit() -> Callable[[], None]:
    """Ctrl-C raises KeyboardInterrupt (commands say what it leaves behind); a second one exits at once.

    Returns what puts the previous handler back when no Ctrl-C came (`main` called in-process)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, _first_interrupt)

    def restore() -> None:
        if signal.getsignal(signal.SIGINT) is _first_interrupt:
            signal.signal(signal.SIGINT, previous)

    return restore
