"""Settings: every `STEPQ_*` variable, read and checked once per process at start (`settings`), and the
per-module model defaults found by scanning the environment (`module_models`).

May import: `stepq.errors`, `stepq.models`.
Configuration is the bottom layer: nothing of definitions, policy, providers, the store or the fleet, because
everything else reads its settings from here. The data it shares with agents (`RateLimit`) and the policy
scope syntax live in `stepq.models`; provider names come from the registry, which installs its
`known_providers` into `module_models` when imported (so settings refuse an unknown provider at start
without importing providers).
"""

from stepq.config.settings import Settings, get_settings, load_settings

__all__ = ["Settings", "get_settings", "load_settings"]
