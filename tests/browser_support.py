"""Shared by the browser tests of the chat page and the console: the system's Chromium driven by Playwright
(headless, no browser download), one gateway + worker per test module on a key prefix of its own, and a
screenshot of every page a test opened, saved under a tmp dir when the test ends (pass or fail)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.chat_support import API_KEY
from tests.conftest import REDIS_URL

TIMEOUT_MS = 60_000


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("Chromium is not installed: apt-get install -y chromium (the browser test uses the system's)")


@contextmanager
def module_prefix() -> Iterator[str]:
    """A key prefix for a whole test module (the conftest `prefix` is per test); its keys go at the end."""
    value = f"aqt-{uuid.uuid4().hex[:10]}"
    try:
        yield value
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        for pattern in (f"{value}:*", f"{value}.*", f"{value}-other:*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
        client.close()


@contextmanager
def browser(sync_api: Any) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def new_context(
    launched: Any, sync_api: Any, shots: Shots, *, key: str | None = API_KEY, width: int = 1100
) -> Iterator[Any]:
    """A fresh browser profile (its own localStorage) holding `key` as the page's API key; its pages are
    photographed before it closes."""
    context = launched.new_context(viewport={"width": width, "height": 800})
    if key is not None:
        context.add_init_script(
            f"localStorage.getItem('stepq.apiKey') || localStorage.setItem('stepq.apiKey', {key!r})"
        )
    context.set_default_timeout(TIMEOUT_MS)
    sync_api.expect.set_options(timeout=TIMEOUT_MS)
    try:
        yield context
    finally:
        shots.save()
        context.close()


class Shots:
    """Pages to photograph when the test ends; the paths are printed (pytest -s, or the failure report)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pages: list[tuple[Any, str]] = []

    def add(self, page: Any, name: str) -> Any:
        self.pages.append((page, name))
        return page

    def save(self) -> None:
        for page, name in self.pages:
            if not page.is_closed():  # a page already photographed is taken again: the latest state wins
                path = self.folder / f"{name}.png"
                page.screenshot(path=str(path), full_page=True)
                print(f"screenshot: {path}")
