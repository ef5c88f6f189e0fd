"""One adapter per wire protocol. The engine sees only `ProviderAdapter` (base.py) and the registry.

May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.config`, `stepq.io_loop`.
`loop_transport` sends the SDKs' requests from the process's provider loop (`stepq.io_loop`).
Providers sit below the definitions: an adapter factory reads an agent through `base.AdapterAgent` and the
registry through `registry.ProviderAgent`, protocols `AgentDefinition` satisfies structurally, so nothing in
here imports `stepq.agents`. Within a provider's folder the shared pieces live below both users (e.g.
`gemini/client.py` for the adapter and the batch API, `bedrock/errors.py` for their classification).

Internal: import the public names from `stepq`; what is in here may change without notice.
"""
