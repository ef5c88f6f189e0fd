"""The named pieces of an agent's prompt and launcher: prompt section names and starter suggestions.

Their own module because definitions and extensions both use them, and extensions build on definitions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

SECTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Suggestion(BaseModel):
    """A starter prompt a chat launcher offers before the first message. A plain string is both label and prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    label: str = Field(min_length=1)
    """What the launcher shows."""
    prompt: str = ""
    """What it sends when picked (default: the label)."""

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"label": value, "prompt": value}
        if isinstance(value, dict) and not value.get("prompt") and "label" in value:
            return {**value, "prompt": value["label"]}
        return value

    def matches(self, text: str) -> bool:
        return text in (self.label, self.prompt)


def check_section_names(sections: Iterable[str], where: str) -> None:
    for name in sections:
        if not SECTION_NAME.match(name):
            raise ValueError(f"{where}: prompt section name {name!r} must be letters, digits, '_', '.' or '-'")
