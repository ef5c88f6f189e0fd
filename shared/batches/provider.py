"""The provider-batch tick: send parked step requests in provider batches, poll them, hand answers back.

One periodic task (`stepq.provider_batch_tick`, on the beat schedule every STEPQ_PROVIDER_BATCH_POLL_S)
runs `tick`, holding a fleet-wide lock:

1. **flush**: a group (provider/model) whose oldest parked request waited STEPQ_PROVIDER_BATCH_WINDOW_S,
   or that holds STEPQ_PROVIDER_BATCH_MAX_SIZE requests, goes out as one provider batch. Its requests
   leave the pending set in the same script that writes the batch record (state `submitting`), so a
   tick that dies before or during the provider call leaves a record the next tick submits again:
   nothing is lost. (A tick that dies after the provider accepted the batch but before the record says
   so sends it twice; each request's answer is still applied once, see `ProviderBatchStore.record`.)
2. **poll**: each open batch is polled; once ended, each answer is recorded for its turn (only while the
   turn still waits for that request) and the turn's step is returned to be sent again. A batch past
   its deadline is cancelled and its unanswered requests are recorded as expired: their steps run online.

The returned `TickReport.resume` lists the steps to send; the Celery task shell sends them, so this
module never imports Celery.

Internal (not part of the `stepq` API).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from stepq.fleet.runtime import Runtime
from stepq.models import StepOutput
from stepq.providers.base import BatchAPI, ProviderError, StepRequest
from stepq.providers.registry import create_adapter
from stepq.store import credentials
from stepq.store.indexes import ACTIVE
from stepq.store.pbatch import ProviderBatchStore, Queued, turn_of

log = logging.getLogger("stepq.provider_batch")

_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


@dataclass
class TickReport:
    sent: int = 0  # requests sent in new provider batches
    collected: int = 0  # answers recorded
    expired: int = 0  # requests given up at their deadline (their steps run online)
    resume: list[tuple[str, int]] = field(default_factory=list)  # (turn id, step) to send again
    busy: bool = False  # another tick holds the lock


def tick(rt: Runtime, *, force_flush: bool = False) -> TickReport:
    """One flush-and-poll pass. `force_flush` sends every group now, whatever its window (tests, shutdown)."""
    report = TickReport()
    token = uuid.uuid4().hex
    lock_ms = int(max(rt.settings.provider_batch_poll_s * 4, 120) * 1000)
    if not rt.redis.set(rt.keys.pbatch_lock, token, nx=True, px=lock_ms):
        report.busy = True
        return report
    try:
        store = ProviderBatchStore(rt.redis, rt.keys, rt.settings.event_ttl_s, rt.settings.redis_cluster)
        now = time.time()
        _flush(rt, store, now, force_flush, report)
        _poll(rt, store, now, report)
        resumed(rt, [turn_id for turn_id, _ in report.resume])
    finally:
        rt.redis.eval(_RELEASE, 1, rt.keys.pbatch_lock, token)
    return report


# --------------------------------------------------------------------------- flush


def _flush(rt: Runtime, store: ProviderBatchStore, now: float, force: bool, report: TickReport) -> None:
    s = rt.settings
    for group in store.groups():
        while True:
            count, oldest = store.pending(group)
            full = count >= s.provider_batch_max_size
            due = oldest is not None and now - oldest >= s.provider_batch_window_s
            if count == 0 or not (full or due or force):
                break
            local_id = f"pb_{uuid.uuid4().hex}"
            members = store.take(group, local_id, s.provider_batch_max_size, now, now + s.provider_batch_deadline_s)
            if not members:
                break
            _submit(rt, store, local_id, members, report)


def _api(rt: Runtime, queued: Queued) -> BatchAPI:
    """The batch API of the group's provider, with the group's tenant's own key when it has one (read now:
    a rotated key is used from the next tick on; a removed one falls back to the fleet's, as online)."""
    payload = queued.payload
    agent = rt.agents.get(str(payload.get("agent")))
    if agent is None:
        raise ProviderError(f"agent {payload.get('agent')!r} is not loaded on this worker", retryable=False)
    provider = str(payload["provider"])
    adapter = create_adapter(provider, agent, str(payload["model"]))
    tenant = payload.get("tenant")
    if isinstance(tenant, str):
        sealed = credentials.parse(rt.redis.hgetall(rt.keys.credentials(tenant))).get(provider)
        if sealed is not None:
            adapter.use_credential(credentials.unseal(sealed, rt.settings.credential_keks, tenant))
    api = adapter.batch_api()
    if api is None:
        raise ProviderError(f"provider {payload['provider']!r} has no batch API", retryable=False)
    return api


def _submit(rt: Runtime, store: ProviderBatchStore, local_id: str, members: list[str], report: TickReport) -> None:
    """Send the batch's requests (again, after a tick that died mid-way); record the provider's batch id."""
    queued = store.requests(members)
    if not queued:  # every member ended or gave its request up meanwhile
        store.close(local_id, "empty")
        return
    try:
        api = _api(rt, queued[0])
        requests = [(q.custom_id, StepRequest.model_validate(q.payload["request"])) for q in queued]
        provider_id = api.submit(local_id, requests)
    except Exception as exc:
        error = (
            exc if isinstance(exc, ProviderError) else ProviderError(f"{type(exc).__name__}: {exc}", retryable=False)
        )
        failures = int(store.batch(local_id).get("failures", "0")) + 1
        if error.retryable and failures < rt.settings.retry_max_attempts:
            log.warning("provider batch %s: submit failed (%s); the next tick retries", local_id, error.describe())
            store.update_batch(local_id, failures=failures)
            return
        log.error("provider batch %s: submit failed for good: %s", local_id, error.describe())
        for q in queued:  # each step counts it as a failed attempt (and may go online)
            _answer(store, q.turn_id, q.custom_id, _error(error), report)
        store.close(local_id, "failed")
        return
    customs = [q.custom_id for q in queued]
    kept = {k: queued[0].payload[k] for k in ("agent", "provider", "model", "tenant") if k in queued[0].payload}
    store.update_batch(local_id, provider_id=provider_id, state="submitted", customs=json.dumps(customs),
                       payload=json.dumps(kept))  # fmt: skip
    report.sent += len(queued)
    log.info("provider batch %s: %d requests sent as %s", local_id, len(queued), provider_id)


# --------------------------------------------------------------------------- poll


def _poll(rt: Runtime, store: ProviderBatchStore, now: float, report: TickReport) -> None:
    for local_id in store.open_batches():
        record = store.batch(local_id)
        if not record:
            store.close(local_id, "gone")
            continue
        if record.get("state") == "submitting":  # a tick died mid-submit, or the provider refused for now
            members = [m for m in record.get("members", "").split(",") if m]
            _submit(rt, store, local_id, members, report)
            continue
        try:
            _poll_one(rt, store, local_id, record, now, report)
        except Exception as exc:  # one provider's outage must not stop the others' batches
            log.warning("provider batch %s: poll failed (%s: %s); the next tick retries", local_id,
                        type(exc).__name__, exc)  # fmt: skip


def _poll_one(
    rt: Runtime, store: ProviderBatchStore, local_id: str, record: dict[str, str], now: float, report: TickReport
) -> None:
    payload = json.loads(record["payload"])
    customs: list[str] = json.loads(record.get("customs", "[]"))
    api = _api(rt, Queued("", "", payload))
    provider_id = record["provider_id"]
    if api.poll(provider_id) == "ended":
        answers = api.results(provider_id)
        outcomes = []
        for custom in customs:
            got = answers.get(custom)
            outcome = _expired() if got is None else _error(got) if isinstance(got, ProviderError) else _output(got)
            outcomes.append((turn_of(custom), custom, outcome))
        for (turn_id, custom, _), stored in zip(outcomes, store.record_many(outcomes), strict=True):
            if stored:
                _resume(turn_id, custom, report)
        store.close(local_id, "ended")
        return
    if now >= float(record.get("deadline_at", "inf")):
        try:
            api.cancel(provider_id)
        except Exception as exc:  # the requests run online either way
            log.warning("provider batch %s: cancel failed: %s: %s", local_id, type(exc).__name__, exc)
        for custom in customs:
            if _answer(store, turn_of(custom), custom, _expired(), report):
                report.expired += 1
        store.close(local_id, "expired")


def _answer(store: ProviderBatchStore, turn_id: str, custom: str, outcome: dict[str, Any], report: TickReport) -> bool:
    if not store.record(turn_id, custom, outcome):
        return False  # the turn ended, moved on, or gave this request up
    _resume(turn_id, custom, report)
    return True


def _resume(turn_id: str, custom: str, report: TickReport) -> None:
    report.collected += 1
    report.resume.append((turn_id, int(custom.rsplit("-", 2)[1])))


def _output(output: StepOutput) -> dict[str, Any]:
    return {"output": output.model_dump(mode="json")}


def _error(exc: ProviderError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "retryable": exc.retryable, "status": exc.status, "code": exc.code}}


def _expired() -> dict[str, Any]:
    return {"expired": True}


def resumed(rt: Runtime, turn_ids: list[str]) -> None:
    """Steps sent again after an answer: the sweeper watches them (a lost message is sent once more)."""
    if turn_ids:
        rt.turns.indexes.add_many(ACTIVE, turn_ids, time.time())
