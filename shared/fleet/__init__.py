"""Running a fleet: the per-process runtime bundle (`runtime`: settings, Redis stores, registries), fleet-wide
rate limits (`ratelimit`), worker heartbeats (`heartbeat`), Prometheus metrics (`metrics`) and what
producers and workers agree on without importing each other (`protocol`: task names, Celery settings;
`broker_clients`: kombu's Redis channel reusing one client).

May import: `stepq.errors`, `stepq.models`, `stepq.approvals`, `stepq.config`, `stepq.logging`, `stepq.providers`,
`stepq.agents`, `stepq.store`.
The runtime wires the store, limits and the agent registry; it never runs a step or a turn, so never the
engine, policy, turns, batches, the workers or the producer. `RateLimit` itself is data in `stepq.models`
(agents and settings hold it); `ratelimit` enforces it and re-exports it.
"""
