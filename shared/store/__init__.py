"""Redis persistence: turn state (CAS), event log + pub/sub, leases, tool results, approvals."""
