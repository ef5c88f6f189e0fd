"""The agent loop, one step at a time, as named stages sharing one `StepContext` (`context`):
begin (`begin`: lease checks, policies, the planned call) -> resume a parked step (`resume`) or call the
model (`model_call`: compaction, replay, provider batch, the online call; `failure`: retries and failover)
-> decide (`decide`: trace, malformed retry, final answer) or run tools (`tools_stage`, `dispatch`,
`tool_exec`; `park` for the calls that wait) -> the endings (`finish`: each one fenced commit).
`runner.StepRunner.deliver` reads as that sequence; `decisions` is the approve and sweep tasks' work.
`lifecycle` is the one list of points the stages call (step start, model request, attempt end, and after a
commit: tool results, step finish, turn finish); the agent's hooks (`hook_calls`) and the OpenTelemetry
spans (`otel_spans`) observe them.

May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.cancel`, `stepq.approvals`, `stepq.config`,
`stepq.logging`, `stepq.providers`, `stepq.agents`, `stepq.policy`, `stepq.store`, `stepq.fleet`, `stepq.turns`,
`stepq.batches`, `stepq.io_loop`. Providers only through their interface and registry (the emitter asks
`stepq.io_loop` whether a delta comes from the provider loop); never the workers or the producer.

Internal: import the public names from `stepq`; what is in here may change without notice.
"""
