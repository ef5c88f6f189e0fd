"""A worker SIGKILLed while a gateway client streams: the client sees step-reset and the turn completes,
on the same SSE connection, with no gateway restart."""

from __future__ import annotations

import os
import signal

from tests.conftest import WorkerProcess, make_settings
from tests.gateway_support import api_keys_setting, serve, sse_events, submit


def test_sigkill_of_the_worker_mid_stream_the_client_sees_step_reset_and_the_end(prefix):
    settings = make_settings(prefix, api_keys=api_keys_setting(), gateway_rate_limit_rpm=0)
    workers = [WorkerProcess(settings, "g1"), WorkerProcess(settings, "g2")]
    try:
        with serve(settings) as gw, gw.client() as http:
            turn_id = submit(http, "rt.slow_stream", "go", metadata={"prefix": prefix})
            pids = {f":{w.proc.pid}": w for w in workers}
            victim = None
            step_start = None
            seen = []
            with http.stream("GET", f"/v1/turns/{turn_id}/events") as response:
                for event in sse_events(response):
                    seen.append(event)
                    if event.event == "step-start" and event.data["step"] == 1:
                        step_start = event
                    if event.event == "text-delta" and event.data["step"] == 1 and victim is None:
                        assert step_start is not None
                        worker_id = step_start.data["data"]["worker"]
                        victim = next(w for suffix, w in pids.items() if worker_id.endswith(suffix))
                        os.kill(victim.proc.pid, signal.SIGKILL)  # mid-stream, no warning
                        victim.proc.wait(timeout=30)
            turn = http.get(f"/v1/turns/{turn_id}").json()
    finally:
        for w in workers:
            w.stop()
    assert victim is not None
    kinds = [(e.event, e.data["step"]) for e in seen]
    assert ("step-reset", 1) in kinds
    assert seen[-1].event == "turn-finish"
    assert [e.id for e in seen] == list(range(1, len(seen) + 1))  # every event once, in order
    starts = [e for e in seen if e.event == "step-start" and e.data["step"] == 1]
    assert len(starts) == 2 and starts[0].data["data"]["worker"] != starts[1].data["data"]["worker"]
    assert kinds.index(("step-reset", 1)) < seen.index(starts[1])
    assert turn["status"] == "completed" and turn["result"]["text"] == "x" * 40
