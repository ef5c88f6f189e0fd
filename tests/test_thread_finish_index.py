"""A thread's finish that starts its next waiting turn lists that turn on the sweeper's `active` list in the same
script (single Redis), so a finisher dying before it sends the turn leaves a turn the sweeper finds; and the
script never writes the turn's `absent` key (a name no command may write, see stepq.store.keys)."""

from __future__ import annotations

from stepq.engine.runner import StepRunner
from stepq.turns.threads import continue_thread, create_thread


def test_the_next_waiting_turn_is_on_the_active_list_once_the_running_one_finishes(rt):
    thread = create_thread(rt, "rt.basic", tenant="acme")
    first = continue_thread(rt, thread.thread_id, prompt="one", tenant="acme")
    second = continue_thread(rt, thread.thread_id, prompt="two", tenant="acme", multitask="enqueue")
    assert rt.turns.indexes.score("active", second.state.turn_id) is None  # waiting: not runnable yet
    runner = StepRunner(rt)
    runner.deliver(first.state.turn_id, 0)
    runner.deliver(first.state.turn_id, 1)  # the finish starts the waiting turn
    assert rt.threads.running(thread.thread_id) == second.state.turn_id
    assert rt.turns.indexes.score("active", second.state.turn_id) is not None
    assert not rt.redis.exists(rt.keys.absent(first.state.turn_id))
