"""Settings: every `STEPQ_*` variable, read and checked once per process at start (`settings`), and the
per-module model defaults found by scanning the environment (`module_models`).

May import: `stepq.errors`, `stepq.models`. Nothing of definitions, policy, providers, the store or the fleet:
everything else reads its settings from here.
"""

from stepq.config.settings import Settings, get_settings, load_settings

__all__ = ["Settings", "get_settings", "load_settings"]
