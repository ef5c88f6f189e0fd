"""The policy resolution chain: request > caller > tenant > environment > agent > default, each layer only
tightening limits, tools, mutation policy and models (`stepq.policy.resolution`).

May import: `stepq.errors`, `stepq.models`, `stepq.config`, `stepq.agents`.
A policy is resolved against an agent's own limits; never the engine, the store (tenant policies are stored
by `stepq.store.policies`), the fleet or the producer. The scope syntax (`SCOPE_ALL`, `check_scope`) is the
policy document's, in `stepq.models`, so settings check `STEPQ_POLICY` without importing this package.
"""
