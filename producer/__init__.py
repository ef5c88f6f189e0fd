"""The producer side: `Client` for applications, the `stepq` CLI and the HTTP gateway.

Internal: import `Client` and its types from `stepq`; the CLI's and the gateway's modules may change.
"""

if __name__ != "stepq.producer":  # the folder's own name would load every module a second time
    raise ImportError(f"import stepq.producer, not {__name__}: this folder is installed as the package stepq.producer")


from stepq.producer.client import ApprovalReceipt, Client, TurnHandle

__all__ = ["ApprovalReceipt", "Client", "TurnHandle"]
