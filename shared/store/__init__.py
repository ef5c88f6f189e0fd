"""Redis persistence: turn state (CAS), event log + pub/sub, leases, tool results, approvals.

May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.cancel`, `stepq.config`.
The store keeps data: it knows no providers, definitions, policy or the engine.

Internal: import the public names from `stepq`; what is in here may change without notice.
"""
