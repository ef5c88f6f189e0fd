"""One adapter per wire protocol. The engine sees only `ProviderAdapter` (base.py).

Internal: import the public names from `stepq`; what is in here may change without notice.
"""
