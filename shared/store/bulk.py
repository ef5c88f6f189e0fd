"""Parsing a long turn's history at once without paying the cyclic garbage collector for it.

A turn's transcript and trace are thousands of small objects when a process first loads a long turn (a waiting
client at the turn's end, the gateway, a worker taking a turn over). Every one of them survives, so the
collections their allocations set off (one per 700) find nothing to free, yet scan the young objects again
each time: on a 1,000-step turn they cost more than the parse (tests/test_bulk_parse.py counts them). The
collector is paused for such a parse and the objects are collected later, once, like any others.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

BULK_ROWS = 256  # fewer rows than this (a step's few new ones) are parsed with the collector as it is


@contextmanager
def collection_paused(rows: int) -> Iterator[None]:
    """Pause automatic collection while `rows` rows are parsed, if they are many; then restore it as it was
    (a process that turned the collector off keeps it off). The switch is the process's: another thread's
    bulk parse may turn it back on a little early, which only costs that thread its saving."""
    if rows < BULK_ROWS or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
