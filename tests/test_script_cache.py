"""After a Redis restart the server's script cache is empty, and it fills again call by call: a round trip may find
one of its scripts cached and the one ahead of it not. Such a call misses (NOSCRIPT) and runs again alone; a rider
behind it (a listing that applies only if the write ahead of it took) ran too early, did nothing, and must run
again after it, or the turn's listing stays behind its status."""

from __future__ import annotations

import time

from stepq.config.settings import Settings
from stepq.engine.runner import StepRunner
from stepq.models import TurnStatus
from stepq.producer.client import Client
from tests.outage_helpers import RedisServer


def _listed(client: Client, status: TurnStatus | None = None) -> list[str]:
    return client.runtime.listings.turn_page("", time.time() + 1, status=status).ids


def test_a_new_turns_listing_that_ran_ahead_of_its_lost_script_is_written_after_it() -> None:
    """After a restart the script cache is empty, and a worker's commit may load the listing's script before
    the next submit: in the MULTI the store's script then fails (NOSCRIPT) while the listing, version-checked,
    finds no turn and does nothing; the script runs again alone, and so must the listing, or the turn never
    appears in its tenant's listing."""
    server = RedisServer()
    try:
        settings = Settings(redis_url=server.url, key_prefix="capture-noscript", agent_modules=["tests.agents_engine"])
        client = Client(settings)
        client.submit("eng.simple", prompt="warm")
        thread = client.create_thread("eng.simple")
        listing_script = client.runtime.listings.turn_script.script
        server.client().script_flush()
        server.client().script_load(listing_script)  # as a worker's first commit after the restart does
        submitted = client.submit("eng.simple", prompt="after the flush")
        server.client().script_flush()
        server.client().script_load(listing_script)
        continued = client.continue_thread(thread.thread_id, prompt="after the flush")
        assert {submitted.turn_id, continued.turn_id} <= set(_listed(client))
    finally:
        server.close()


def _run(client: Client, turn_id: str) -> None:
    runner, step = StepRunner(client.runtime), 0
    for _ in range(5):
        decision = runner.deliver(turn_id, step)
        if decision.action != "next":
            break
        step = decision.step


def test_a_steps_listing_that_ran_ahead_of_its_lost_commit_is_written_after_it() -> None:
    """A step's commits share a round trip with their listing (through the event log's group commit): a commit
    script the cache lost runs again alone, and the listing behind it too, so a finished turn is listed as
    finished (its listing would otherwise say running until it expired)."""
    server = RedisServer()
    try:
        settings = Settings(redis_url=server.url, key_prefix="noscript-step", agent_modules=["tests.agents_engine"])
        client = Client(settings)
        _run(client, client.submit("eng.simple", prompt="warm").turn_id)
        handle = client.submit("eng.simple", prompt="after the flush")
        runner = StepRunner(client.runtime)
        assert runner.deliver(handle.turn_id, 0).action == "next"  # a tool step; the last one answers
        listing_script = client.runtime.listings.turn_script.script
        server.client().script_flush()
        server.client().script_load(listing_script)  # as another process's first listing after the restart does
        assert runner.deliver(handle.turn_id, 1).action == "none"
        assert client.get(handle.turn_id).status == TurnStatus.COMPLETED
        assert handle.turn_id in _listed(client, TurnStatus.COMPLETED)
        assert handle.turn_id not in _listed(client, TurnStatus.RUNNING) + _listed(client, TurnStatus.QUEUED)
    finally:
        server.close()
