"""Fixtures the harness's tests share: the real browser the panel's tests drive."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium through Playwright, headless, never a browser of Playwright's own."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (the Makefile's system-deps installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (the `dev` extra)")
    with sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-proxy-server"]
        )
        yield launched
        launched.close()
