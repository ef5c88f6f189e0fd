"""The producer side: `Client` for applications, and the `agentq` CLI."""

from producer.client import ApprovalReceipt, Client, TurnHandle

__all__ = ["ApprovalReceipt", "Client", "TurnHandle"]
