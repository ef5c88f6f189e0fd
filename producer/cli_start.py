"""What every `stepq` command does first: read the settings and, for a one-shot command, reach Redis.

Its own module because both the main CLI (`cli`) and `stepq batch` (`batch`, which `cli` dispatches to)
start this way: neither imports the other for it.
"""

from __future__ import annotations

from stepq.config.settings import Settings
from stepq.config.settings import load_settings as settings_from_env
from stepq.embedded import with_demo_agents
from stepq.store.connection import first_contact


def load_settings() -> Settings:
    """The environment's settings; the embedded mode also loads the bundled demo agents.

    A bad value raises ConfigurationError naming the variable: one line, exit 2."""
    settings = settings_from_env()
    return with_demo_agents(settings) if settings.embedded else settings


def reach_redis(settings: Settings) -> None:
    """A one-shot command whose Redis never answered fails within seconds (see `first_contact`), with the
    same one line as any unreachable Redis; once it answered, later calls wait outages out as usual."""
    if not settings.embedded:
        first_contact(settings)
