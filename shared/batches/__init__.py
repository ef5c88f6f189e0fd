"""Batches: items and their idempotency keys (`items`), the worker-side batch driver that keeps a submitted
batch's items in flight (`driver`), and provider batch APIs (`provider`: the periodic tick that groups
parked model requests into one provider batch per provider/model).

May import: `stepq.errors`, `stepq.models`, `stepq.config`, `stepq.providers`, `stepq.store`, `stepq.fleet`,
`stepq.turns`.
Batches submit turns and park provider calls; the engine steps them (it imports `items`), so never the
engine, the workers or the producer.
"""
