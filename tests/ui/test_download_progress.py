"""The workbench shows a download: the models table's state cell reads "downloading" with a
progress bar of the bytes done, while the stand-in hub holds the file mid-way; when the
hub lets the rest through the model turns ready."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, expect

from modelpool.config import load_config
from modelpool.server.app import create_app
from tests import hub_repos as r
from tests.hub_standin import HubStandin
from tests.live_server import live_server
from tests.ui.conftest import open_tab

REPO, MODEL = "standin/workbench-GGUF", "hub-model"
FILE = r.gguf_name("Q4_K_M")


@pytest.fixture
def hub(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    with HubStandin() as standin:
        standin.add_commit(REPO, {FILE: r.smollm2_gguf()})
        monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
        yield standin


async def test_models_table_shows_the_download(browser: Browser, hub: HubStandin, hub_env: Path) -> None:
    gate = hub.hold(FILE, after_bytes=40_000_000)
    model: dict[str, Any] = {"backend": "llama_cpp", "source": f"hf:{REPO}", "preload": False}
    cli = {"enabled_models": [MODEL], "models": {MODEL: model}, "hf_cache_dir": str(hub_env)}
    async with live_server(create_app(load_config(None, cli=cli, environ={}))) as url:
        async with httpx.AsyncClient(base_url=url) as client:  # a request starts the load (and gets a 503)
            started = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            assert started.status_code == 503
        async for tab in open_tab(browser, url):
            await tab.open("models")
            state = tab.page.locator(f'tr[data-model="{MODEL}"] td[data-col="state"]')
            await expect(state).to_contain_text("downloading", timeout=30_000)
            bar = state.get_by_role("progressbar", name=re.compile(f"Download of {MODEL}: .* of .*MiB"))
            await expect(bar).to_be_visible()
            await expect(bar).to_have_attribute("value", re.compile(r"^[1-9]\d*$"))  # bytes arrived
            assert 0 < float(await bar.get_attribute("value") or 0) < float(await bar.get_attribute("max") or 0)
            await tab.screenshot("models-downloading")
            gate.release()
            await expect(state).to_have_text("ready", timeout=60_000)
            await expect(state.get_by_role("progressbar")).to_have_count(0)
