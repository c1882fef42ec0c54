"""The models page's LoRA adapters in a real browser: a model's declared adapters listed in
its panel, loaded and unloaded with a button, the state changing on screen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, expect

from modelpool.config import load_config
from modelpool.server.app import create_app
from tests.e2e.conftest import smollm2_gguf
from tests.live_server import live_server
from tests.lora_models import lora_gguf
from tests.ui.conftest import Tab, open_tab

MODEL = "smollm2-lora"


@pytest.fixture(scope="module")
async def lora_url() -> AsyncIterator[str]:
    models: dict[str, Any] = {MODEL: {
        "backend": "llama_cpp", "source": str(smollm2_gguf()), "options": {"n_ctx": 256, "parallel": 1},
        "adapters": {"pirate": str(lora_gguf("pirate")), "poet": str(lora_gguf("poet"))}}}  # fmt: skip
    cli = {"enabled_models": list(models), "models": models}
    async with live_server(create_app(load_config(None, cli=cli, environ={}))) as url:
        yield url


@pytest.fixture
async def lora_tab(browser: Browser, lora_url: str) -> AsyncIterator[Tab]:
    async for opened in open_tab(browser, lora_url):
        yield opened


async def test_adapters_are_listed_and_load_and_unload_from_their_buttons(lora_tab: Tab, lora_url: str) -> None:
    page = lora_tab.page
    await lora_tab.open("models")
    await page.get_by_role("button", name=f"Select {MODEL}").click()
    detail = page.locator("#model-detail")
    await expect(detail.locator(".detail-head .state")).to_have_text("ready", timeout=90_000)
    pirate = detail.locator('li[data-adapter="pirate"]')
    await expect(pirate).to_contain_text(f"{MODEL}:pirate — not loaded")
    await expect(detail.locator('li[data-adapter="poet"]')).to_contain_text("not loaded")

    await pirate.get_by_role("button", name="Load pirate").click()
    await expect(pirate).to_contain_text("— loaded", timeout=30_000)
    async with httpx.AsyncClient(base_url=lora_url) as http:
        assert (await http.get(f"/v1/admin/models/{MODEL}/status")).json()["adapters_loaded"] == ["pirate"]
    await pirate.get_by_role("button", name="Unload pirate").click()
    await expect(pirate).to_contain_text("not loaded", timeout=30_000)
    async with httpx.AsyncClient(base_url=lora_url) as http:
        assert (await http.get(f"/v1/admin/models/{MODEL}/status")).json()["adapters_loaded"] == []
