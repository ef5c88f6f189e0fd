"""The policy resolution chain: request > caller > tenant > environment > agent > default, each layer only
tightening limits, tools, mutation policy and models (`stepq.policy.resolution`).

May import: the package root's leaves and `stepq.agents` (a policy is resolved against an agent's own
limits). Never the engine, the store (tenant policies are stored by `stepq.store.policies`), the fleet or
the producer.
"""
