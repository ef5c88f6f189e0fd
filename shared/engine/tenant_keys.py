"""A tenant's own provider API key for this step's model call (docs/operate/tenants.md).

The sealed record comes with the tenant's policy, read at the policy version the step's lease read (no round
trip of its own); it is opened here, on the worker, and handed to the adapter only. The key is never put on
the turn, an event, a trace, a span or a log line, and errors about it name the tenant and provider only.
"""

from __future__ import annotations

from stepq.engine.context import StepContext
from stepq.policy.resolution import tenant_of
from stepq.providers.base import ProviderAdapter
from stepq.store.credentials import unseal


def apply(ctx: StepContext, adapter: ProviderAdapter) -> None:
    """Point `adapter` at the turn's tenant's key for its provider, if the tenant stored one."""
    tenant = keyed_tenant(ctx)
    if tenant is not None:
        sealed = ctx.rt.policies.credentials_at_version(tenant, ctx.policy_version)[ctx.state.provider]
        adapter.use_credential(unseal(sealed, ctx.rt.settings.credential_keks, tenant))


def keyed_tenant(ctx: StepContext) -> str | None:
    """The turn's tenant when it stored its own key for the step's provider: its provider-batch requests go
    in batches of their own, sent with that key (stepq.batches.provider)."""
    tenant = tenant_of(ctx.state.metadata)
    if tenant is None:
        return None
    stored = ctx.rt.policies.credentials_at_version(tenant, ctx.policy_version)
    return tenant if ctx.state.provider in stored else None
