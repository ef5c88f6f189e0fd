"""Batches: items and their idempotency keys (`items`), the worker-side batch driver that keeps a submitted
batch's items in flight (`driver`), and provider batch APIs (`provider`: the periodic tick that groups
parked model requests into one provider batch per provider/model).

May import: the package root, `agents`, `providers` (interface and registry), `store`, `fleet`, `turns`.
Never the engine, the workers or the producer.
"""
