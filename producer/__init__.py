"""The producer side: `Client` for applications, the `stepq` CLI and the HTTP gateway.

May import: `stepq.errors`, `stepq.models`, `stepq.jsonsafe`, `stepq.cancel`, `stepq.approvals`, `stepq.config`,
`stepq.logging`, `stepq.providers`, `stepq.agents`, `stepq.policy`, `stepq.store`, `stepq.fleet`, `stepq.turns`,
`stepq.batches`, `stepq.engine`, `stepq.embedded`.
Never worker code: it sends tasks by name (`stepq.embedded` starts an in-process worker for it).

Internal: import `Client` and its types from `stepq`; the CLI's and the gateway's modules may change.
"""

if __name__ != "stepq.producer":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq.producer, not {__name__}: this folder is installed as the package stepq.producer")


from stepq.producer.client import ApprovalReceipt, Client, TurnHandle

__all__ = ["ApprovalReceipt", "Client", "TurnHandle"]
