"""Starting and continuing turns: validating and storing a submit (`submit`), threads (`threads`), a caller's
transcript checks (`transcripts`), attachments (`attachments`) and a caller's answers to client-side tool
calls (`client_results`).

Used by the producer (Client, gateway) and by the workers (a batch driver submits, a thread continues).
May import: the package root, `agents`, `policy`, `providers.registry`, `store` and `fleet`. Never the
engine, batches, the workers or the producer.
"""
