"""Starting and continuing turns: validating and storing a submit (`submit`), threads (`threads`), a caller's
transcript checks (`transcripts`), attachments (`attachments`) and a caller's answers to client-side tool
calls (`client_results`).

Used by the producer (Client, gateway) and by the workers (a batch driver submits, a thread continues).
May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.config`, `stepq.providers`, `stepq.agents`,
`stepq.policy`, `stepq.store`, `stepq.fleet`.
Turns are submitted and read here, never stepped: never the engine, batches, the workers or the producer.
"""
