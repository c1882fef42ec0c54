"""Browser tests of the workbench: Playwright driving Debian's Chromium (`/usr/bin/chromium`,
installed by `make install-test` with apt) against a real uvicorn server on 127.0.0.1.

Every tab records the page's console errors and uncaught exceptions and fails its test if
any appear, so "no console errors" is checked by every UI test, not by one. Chromium logs
each non-2xx fetch as a console error; a test that expects one says which status with
`tab.expect_status(403)`.

With MODELPOOL_UI_SCREENSHOTS=DIR the tests save their screenshots there
(`make screenshots` refreshes docs/ui/).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi import FastAPI

from tests.live_server import live_server

if TYPE_CHECKING:  # playwright is imported lazily: without Chromium the tests skip before it loads
    from playwright.async_api import Browser, Page

UI_DIR = Path(__file__).parent
CHROMIUM = os.environ.get("MODELPOOL_CHROMIUM", "/usr/bin/chromium")
# As the machine's probe found: without the background-networking flags Chromium keeps
# dialling Google's hosts, which this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_FAILED_LOAD = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if UI_DIR in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Tab:
    """One browser page on the workbench, with what it logged."""

    page: Page
    base_url: str
    errors: list[str] = field(default_factory=list)
    expected_statuses: set[int] = field(default_factory=set)

    def expect_status(self, *statuses: int) -> None:
        """Allow the console line Chromium writes for these HTTP error statuses."""
        self.expected_statuses.update(statuses)

    async def open(self, page_name: str) -> None:
        await self.page.goto(f"{self.base_url}/ui/#{page_name}")

    def unexpected_errors(self) -> list[str]:
        unexpected = []
        for text in self.errors:
            status = _FAILED_LOAD.search(text)
            if status and int(status.group(1)) in self.expected_statuses:
                continue
            unexpected.append(text)
        return unexpected

    async def screenshot(self, name: str) -> None:
        """Saved only when MODELPOOL_UI_SCREENSHOTS names a directory."""
        target = os.environ.get("MODELPOOL_UI_SCREENSHOTS")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            await self.page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and shutil.which(CHROMIUM) is None:
        pytest.skip(
            f"no Chromium at {CHROMIUM}: `make install-test` installs Debian's chromium with apt "
            "(as root); elsewhere set MODELPOOL_CHROMIUM to a Chromium binary"
        )
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture(scope="session")
async def ui_url(app: FastAPI) -> AsyncIterator[str]:
    """The session's shared starter app (models already loaded) on a real socket."""
    async with live_server(app, lifespan=False) as url:
        yield url


async def open_tab(browser: Browser, base_url: str) -> AsyncIterator[Tab]:
    """A fresh browser context (no stored key), failing the test on console errors."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    tab = Tab(page, base_url)
    page.on("console", lambda message: tab.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: tab.errors.append(f"uncaught: {exc}"))
    try:
        yield tab
    finally:
        await context.close()
    assert tab.unexpected_errors() == [], "the page logged errors"


@pytest.fixture
async def tab(browser: Browser, ui_url: str) -> AsyncIterator[Tab]:
    async for opened in open_tab(browser, ui_url):
        yield opened
