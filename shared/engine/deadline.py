"""The turn's wall-clock budget inside a step: the model stream and the tools stop at the deadline.

Between steps the budget is checked by engine/stopping.py; a step that started in time could still run far
past it (a long stream, a slow tool). Within a step the deadline is the turn's start plus its
`max_wall_clock_s`: the stream's stop check turns true then (the adapters look at it at every chunk, and
Gemini's also while its upstream is silent), and no tool's call waits past it. An object-mode turn's
answer step is never cut: like the check between steps, the budget spends the reserved answer step and that
step always runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stepq.agents.definition import AgentDefinition
from stepq.models import TurnState
from stepq.store.leases import StepLease

__all__ = ["BUDGET_SPENT", "StepDeadline", "step_deadline"]

BUDGET_SPENT = "the turn's wall-clock budget ran out"


class StepDeadline:
    """When this step must stop (None: no wall-clock budget, or an answer step that always runs), and whether
    the stream was stopped by it."""

    def __init__(self, at: float | None) -> None:
        self.at = at
        self.cut = False

    def stop_check(self, lease: StepLease) -> Callable[[], bool]:
        """The stream's `should_stop`: the lease's (cancelled, lost) and, with a budget, the deadline's."""
        at = self.at
        if at is None:
            return lambda: lease.should_stop

        def should_stop() -> bool:
            if lease.should_stop:
                return True
            if time.time() >= at:
                self.cut = True
                return True
            return False

        return should_stop

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline; 0 or less: passed)."""
        return None if self.at is None else self.at - time.time()


def step_deadline(state: TurnState, agent: AgentDefinition) -> StepDeadline:
    """The step's deadline from the turn's budget; none for an object-mode answer step (it always runs)."""
    limit = state.limits.max_wall_clock_s
    if not limit or not state.started_at:
        return StepDeadline(None)
    if agent.execution_mode == "object" and state.answer_due is not None:
        return StepDeadline(None)
    return StepDeadline(state.started_at + limit)
