"""The one way the browser tests open a page: headless Chromium from the
system's package (/usr/bin/chromium; `make install` installs it), driven by
Playwright, never a browser Playwright would download."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
#: No sandbox (tests run as root), no GPU, and nothing that reaches out to the
#: network on its own.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextmanager
def chromium_page(width: int) -> Iterator[Page]:
    """A page of headless Chromium ``width`` pixels wide; the browser and its
    processes are closed on the way out, also when the test fails."""
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is missing: `make install` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": 1000})
        finally:
            browser.close()
