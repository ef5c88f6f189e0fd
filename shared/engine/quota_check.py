"""The tenant's usage quotas, checked before every model call (docs/operate/tenants.md).

The counters come with the step's lease (store/turns.py `_BEGIN`) when this process knows which ones the turn
checks (its previous step ran here); otherwise, once, they are read apart. A spent quota stops the turn: it
fails with finish reason `quota-exceeded`, after a `quota-exceeded` event naming the quota, its window and
when it resets. The step's own usage is counted with its commit (`Delivery.commit`).
"""

from __future__ import annotations

import time

from stepq.engine.context import Decision, StepContext
from stepq.engine.finish import finish
from stepq.models import EventType, FinishReason, TurnStatus
from stepq.policy.resolution import quota_rules, tenant_of
from stepq.store.quotas import denial, window


def count_toward(ctx: StepContext) -> None:
    """Find the tenant's quotas this step counts toward (every step: a resumed one commits a parked step's usage)."""
    state, rt = ctx.state, ctx.rt
    tenant = tenant_of(state.metadata)
    rules = quota_rules(tenant, rt.policies.at_version(tenant, ctx.policy_version), ctx.agent.id) if tenant else []
    now = time.time()
    ctx.quota_windows = [window(rt.keys, tenant or "", scope, quota, label, now) for scope, quota, label in rules]
    rt.quotas.expect(state.turn_id, [w.key for w in ctx.quota_windows])  # the turn's next step here reads them


def before_model_call(ctx: StepContext) -> Decision | None:
    """None: no quota is spent; else the turn's end (see the module docstring)."""
    windows = ctx.quota_windows
    if not windows:
        return None
    keys = [w.key for w in windows]
    read = ctx.quota_usage if set(keys) <= set(ctx.quota_usage) else ctx.rt.quotas.read(keys)
    spent = denial(windows, read)
    if spent is None:
        return None
    ctx.state.error = spent.message
    ctx.emitter.publish(EventType.QUOTA_EXCEEDED, spent.event())
    ctx.emitter.publish(EventType.ERROR, {"message": spent.message})
    return finish(ctx, TurnStatus.FAILED, FinishReason.QUOTA_EXCEEDED)
