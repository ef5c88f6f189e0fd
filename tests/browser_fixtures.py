"""The pytest fixtures of the browser test modules (tests/test_chat_page.py, tests/test_console_browser.py):
one gateway + worker stack and one Chromium per module, and per test a fresh browser profile whose pages are
photographed when the test ends. A module imports them by name (`from tests.browser_fixtures import ...`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_support import Shots, browser, module_prefix, new_context
from tests.chat_support import ChatStack, chat_stack

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def stack() -> Iterator[ChatStack]:
    with module_prefix() as prefix, chat_stack(prefix) as running:
        yield running


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser(sync_api) as launched:
        yield launched


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[Shots]:
    taken = Shots(tmp_path)
    yield taken
    taken.save()


@pytest.fixture
def context(chromium: Any, shots: Shots) -> Iterator[Any]:
    with new_context(chromium, sync_api, shots) as ctx:
        yield ctx
