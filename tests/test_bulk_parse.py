"""Loading a long turn's history at once does not set off a garbage collection per 700 objects parsed
(stepq.store.bulk): what a waiting client pays at a 1,000-step turn's end. Counted with `gc.callbacks`."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from stepq.fleet.runtime import Runtime
from stepq.models import AttemptTrace, StepTrace, ToolCallTrace
from stepq.store.bulk import BULK_ROWS
from stepq.store.turns import TurnStore
from tests.agents_engine import start


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs."""
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield started
    finally:
        gc.callbacks.remove(count)


def _long_turn(rt: Runtime, prefix: str, steps: int) -> str:
    turn_id = start(rt, "eng.simple", prefix)
    state = rt.turns.load(turn_id)
    assert state is not None
    state.trace.steps += [
        StepTrace(
            step=i,
            provider="scripted",
            model="scripted",
            tool_calls=["t"],
            calls=[ToolCallTrace(id=f"call_{i}", name="t", input_chars=8, output_chars=8, status="ok")],
            attempts=[AttemptTrace(attempt=0, provider="scripted", model="scripted", started_at=1.0)],
        )
        for i in range(steps)
    ]
    assert rt.turns.commit(state)
    return turn_id


def _fresh_store(rt: Runtime) -> TurnStore:
    """A store with nothing cached, as in a process that never saw the turn."""
    store = rt.turns
    return TurnStore(store.client, store.keys, store.ttl_s, store.indexes.separate, store.listings)


def test_a_long_history_is_parsed_without_a_collection_per_700_objects(rt, prefix, collections):
    assert gc.isenabled()
    turn_id = _long_turn(rt, prefix, 1000)
    store = _fresh_store(rt)
    collections.clear()
    state = store.load(turn_id)
    assert state is not None and len(state.trace.steps) == 1000
    # ~27 collections if not paused (each row is ~20 objects); with the pause, one may run as it ends, and another
    # thread of this process (an earlier test's lease heartbeat) may set off one more
    assert len(collections) <= 3, collections
    assert gc.isenabled()


def test_a_process_that_turned_the_collector_off_keeps_it_off(rt, prefix):
    turn_id = _long_turn(rt, prefix, BULK_ROWS + 1)
    gc.disable()
    try:
        assert _fresh_store(rt).load(turn_id) is not None
        assert not gc.isenabled()
    finally:
        gc.enable()
