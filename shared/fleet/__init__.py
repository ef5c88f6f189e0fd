"""Running a fleet: the per-process runtime bundle (`runtime`: settings, Redis stores, registries), fleet-wide
rate limits (`ratelimit`), worker heartbeats (`heartbeat`), Prometheus metrics (`metrics`) and what
producers and workers agree on without importing each other (`protocol`: task names, Celery settings).

May import: the package root, `agents` (the registry), `providers.base`, `store`. Never the engine, policy,
turns, batches, the workers or the producer.
"""
