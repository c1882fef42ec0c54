"""The models page's "Reload config" button in a real browser, on a server started from a real
config file that the test rewrites: an added model appears in the table, a removed one
leaves it, an invalid file shows the server's reason and changes nothing, and the button is
marked busy while a reload runs. The models are the starter's, declared on demand, so no
reload here waits for a load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from playwright.async_api import Browser, Route, expect

from modelpool.config.loader import config_files, load_config
from modelpool.server.app import create_app
from modelpool.server.reload import ConfigSources
from tests.conftest import CHAT_MODEL, EMBED_MODEL
from tests.live_server import live_server
from tests.ui.conftest import Tab, open_tab


def write(path: Path, enabled: list[str]) -> None:
    on_demand = {name: {"preload": False} for name in enabled}
    path.write_text(yaml.safe_dump({"enabled_models": enabled, "models": on_demand}))


@pytest.fixture
async def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "modelpool.yaml"
    write(path, [EMBED_MODEL])
    return path


@pytest.fixture
async def reload_tab(browser: Browser, config_path: Path) -> AsyncIterator[Tab]:
    config = load_config(config_path, environ={})
    sources = ConfigSources(lambda: load_config(config_path, environ={}), config_files(config_path, environ={}))
    async with live_server(create_app(config, sources=sources)) as url:
        async for opened in open_tab(browser, url):
            opened.expect_status(400)  # the invalid file's refusal
            yield opened


async def test_reload_adds_and_removes_models_and_an_invalid_file_changes_nothing(
    reload_tab: Tab, config_path: Path
) -> None:
    page = reload_tab.page
    await reload_tab.open("models")
    rows = page.locator("table.models-table tbody tr")
    await expect(rows).to_have_count(1, timeout=10_000)
    button = page.get_by_role("button", name="Reload config")
    result = page.locator(".reload-result")
    alert = page.locator(".reload-config [role=alert]")

    # Held at the browser until released, so the busy state can be seen while it runs.
    release = asyncio.Event()

    async def hold(route: Route) -> None:
        await release.wait()
        await route.continue_()

    await page.route("**/v1/admin/reload", hold)
    write(config_path, [EMBED_MODEL, CHAT_MODEL])
    await button.click()
    await expect(button).to_have_attribute("aria-disabled", "true")
    await expect(result).to_have_text("Reloading the config…")
    release.set()
    await expect(result).to_have_text(f"Config reloaded; added: {CHAT_MODEL}; 1 unchanged.", timeout=30_000)
    await expect(button).to_have_attribute("aria-disabled", "false")
    await expect(page.locator(f'tr[data-model="{CHAT_MODEL}"] td[data-col="state"]')).to_have_text("unloaded")
    await page.unroute("**/v1/admin/reload")

    config_path.write_text("enabled_models: [no-such-model]\n")
    await button.click()
    await expect(alert).to_contain_text("no-such-model", timeout=30_000)
    await expect(alert).to_contain_text("nothing changed")
    await expect(result).to_have_text("")
    await expect(rows).to_have_count(2)

    write(config_path, [EMBED_MODEL])
    await button.click()
    removed = f"Config reloaded; removed (draining): {CHAT_MODEL}; 1 unchanged."
    await expect(result).to_have_text(removed, timeout=30_000)
    await expect(alert).to_have_text("")
    await expect(page.locator(f'tr[data-model="{CHAT_MODEL}"]')).to_have_count(0, timeout=10_000)
    await expect(rows).to_have_count(1)
