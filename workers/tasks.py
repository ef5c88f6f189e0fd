"""Tasks: `run_step` (exactly one loop step per task), `approve`, and the periodic `sweep`."""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Celery, Task

from shared.config import Settings
from shared.decisions import decide_approval, sweep
from shared.engine.runner import StepRunner
from shared.protocol import APPROVE, RUN_STEP, SWEEP
from shared.runtime import Runtime, get_runtime

log = logging.getLogger("agentq.worker")


def register_tasks(app: Celery) -> None:
    settings: Settings = app.conf.agentq_settings

    def runtime() -> Runtime:
        return get_runtime(settings)

    def enqueue_step(turn_id: str, step: int, countdown: float | None = None) -> None:
        app.send_task(RUN_STEP, args=[turn_id, step], countdown=countdown, queue=settings.queue)

    @app.task(name=RUN_STEP, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
    def run_step(self: Task, turn_id: str, step: int, attempt: int = 0) -> str:
        decision = StepRunner(runtime()).deliver(turn_id, step)
        if decision.action == "next":
            enqueue_step(turn_id, decision.step)
        elif decision.action == "retry":
            raise self.retry(args=[turn_id, step], kwargs={"attempt": decision.attempt}, countdown=decision.countdown)
        elif decision.action == "reschedule":
            enqueue_step(turn_id, step, countdown=decision.countdown)
        return f"{decision.action}:{decision.reason}"

    @app.task(name=APPROVE, acks_late=True, reject_on_worker_lost=True)
    def approve(
        approval_id: str,
        token: str,
        approved: bool,
        reason: str = "",
        reviewer: str = "",
        args: dict[str, Any] | None = None,
        reply_to: str | None = None,
    ) -> str:
        rt = runtime()
        outcome = decide_approval(rt, approval_id, token, approved, reason=reason, reviewer=reviewer, args=args)
        if outcome.resume is not None:
            enqueue_step(*outcome.resume)
        if reply_to:
            reply = rt.keys.approval_reply(reply_to)
            payload = {"accepted": outcome.accepted, "code": outcome.code, "message": outcome.message}
            pipe = rt.redis.pipeline()
            pipe.rpush(reply, json.dumps(payload))
            pipe.expire(reply, 300)
            pipe.execute()
        return outcome.code

    @app.task(name=SWEEP, ignore_result=True)
    def sweep_task() -> int:
        found = sweep(runtime(), settings.queued_grace_s)
        for turn_id, step in found:
            log.warning("sweeper re-enqueues turn %s step %s", turn_id, step)
            enqueue_step(turn_id, step)
        return len(found)
