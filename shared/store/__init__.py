"""Redis persistence: turn state (CAS), event log + pub/sub, leases, tool results, approvals.

Internal: import the public names from `stepq`; what is in here may change without notice.
"""
