"""The workbench's VRAM column in a real browser, with NVML answered by the stand-in binding
(`tests/nvml_standin.py`): hidden while the server sees no GPU, then each model's measured
GPU memory (a real `llama_server` engine process found by PID) and its estimate, and the
GPUs' use in the page's summary."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.async_api import Browser, expect

from modelpool.config import load_config
from modelpool.server.app import create_app
from tests.e2e.conftest import smollm2_gguf
from tests.live_server import live_server
from tests.nvml_standin import GiB, StandinNvml, nvml_standin, one_gpu
from tests.ui.conftest import open_tab

__all__ = ["nvml_standin"]  # the fixture, used by name
ENGINE = "smollm2-engine"


async def test_the_vram_column_shows_only_with_a_gpu(browser: Browser, nvml_standin: Any, tmp_path: Any) -> None:
    numbers: dict[str, Any] = {"gpus": []}  # NVML answers, and sees no GPU
    standin: StandinNvml = nvml_standin(lambda: numbers)
    options = {"context_length": 2048, "gpu_layers": -1, "stop_grace_s": 5}
    models = {ENGINE: {"backend": "llama_server", "source": str(smollm2_gguf()), "preload": False, "options": options}}
    cli = {"enabled_models": [ENGINE], "models": models, "state_dir": str(tmp_path)}
    async with (
        live_server(create_app(load_config(None, cli=cli, environ={}))) as url,
        httpx.AsyncClient(base_url=url, timeout=120) as http,
    ):
        async for tab in open_tab(browser, url):
            page = tab.page
            await tab.open("models")
            vram = page.locator(f'tr[data-model="{ENGINE}"] td[data-col="vram"]')
            await expect(page.locator(f'tr[data-model="{ENGINE}"] td[data-col="state"]')).to_have_text("unloaded")
            await expect(page.get_by_role("columnheader", name="VRAM")).to_be_hidden()
            await expect(vram).to_be_hidden()

            numbers.update(one_gpu(total=80 * GiB, used=GiB))
            loaded = await http.post(f"/v1/admin/models/{ENGINE}/load")
            assert loaded.status_code == 200, loaded.text
            numbers["processes"] = [{"gpu": 0, "pid": loaded.json()["replicas"][0]["pid"], "used": 3 * GiB // 2}]
            await expect(page.get_by_role("columnheader", name="VRAM")).to_be_visible(timeout=10_000)
            await expect(vram).to_contain_text("1.5 GiB")  # measured, by the engine's PID
            await expect(vram).to_contain_text("est. ")  # the GGUF's estimate beside it
            await expect(page.locator(".summary")).to_contain_text("VRAM 2.5 GiB of 80.0 GiB used on 1 GPU")
    assert standin.inits == 1
