"""One adapter per wire protocol. The engine sees only `ProviderAdapter` (base.py)."""
