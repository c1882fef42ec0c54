"""The batches page in a real browser, on the starter's MiniLM and SmolLM2: a JSONL file
uploaded from the form becomes a batch that completes on screen and whose output downloads;
a running batch's Cancel button stops it (cancelling, then cancelled)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, expect

from modelpool.config import load_config
from modelpool.server.app import create_app
from tests.conftest import CHAT_MODEL, EMBED_MODEL
from tests.live_server import live_server
from tests.ui.conftest import Tab, open_tab
from tests.ui.test_accessibility import nameless_controls

SENTENCES = ["The cat sat on the mat.", "A batch of two lines."]


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.fixture(scope="module")
async def batch_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    directory = tmp_path_factory.mktemp("ui-batches")
    cli = {"enabled_models": [CHAT_MODEL, EMBED_MODEL], "batch_api": {"dir": str(directory), "concurrency": 1}}
    async with live_server(create_app(load_config(None, cli=cli, environ={}))) as url:
        yield url


@pytest.fixture
async def batch_tab(browser: Browser, batch_url: str) -> AsyncIterator[Tab]:
    async for opened in open_tab(browser, batch_url):
        yield opened


async def test_an_uploaded_embeddings_batch_completes_and_its_output_downloads(batch_tab: Tab, tmp_path: Path) -> None:
    page = batch_tab.page
    await batch_tab.open("batches")
    lines = [{"custom_id": f"s{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED_MODEL, "input": text}} for i, text in enumerate(SENTENCES)]  # fmt: skip
    await page.get_by_label("Requests (JSONL)").set_input_files(
        {"name": "requests.jsonl", "mimeType": "application/jsonl", "buffer": jsonl(lines)}
    )
    await page.get_by_label("Endpoint").select_option("/v1/embeddings")
    await page.get_by_role("button", name="Upload and start").click()
    row = page.locator("tr[data-batch]")
    await expect(row).to_have_count(1, timeout=10_000)
    batch_id = await row.get_attribute("data-batch")
    await expect(row.locator('td[data-col="endpoint"]')).to_have_text("/v1/embeddings")
    await expect(row.locator('td[data-col="status"] .state')).to_have_text("completed", timeout=60_000)
    await expect(row.locator('td[data-col="requests"]')).to_have_text("2 of 2 done")
    await expect(row.get_by_role("button", name=f"Cancel {batch_id}")).to_be_hidden()
    assert await nameless_controls(page) == []  # the form's fields and the row's buttons are named

    async with page.expect_download() as downloading:
        await row.get_by_role("button", name=f"Download output of {batch_id}").click()
    saved = tmp_path / "output.jsonl"
    await (await downloading.value).save_as(saved)
    answers = [json.loads(line) for line in saved.read_text().splitlines()]
    assert [answer["custom_id"] for answer in answers] == ["s0", "s1"]
    assert all(answer["response"]["status_code"] == 200 for answer in answers)
    assert [len(answer["response"]["body"]["data"][0]["embedding"]) for answer in answers] == [384, 384]
    await batch_tab.screenshot("batches")


async def test_cancel_stops_a_running_batch(batch_tab: Tab, batch_url: str) -> None:
    page = batch_tab.page
    # Eight replies of 300 tokens: the batch still runs when the button is pressed.
    story = {"model": CHAT_MODEL, "max_tokens": 300, "ignore_eos": True,
             "messages": [{"role": "user", "content": "Tell a long story."}]}  # fmt: skip
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": story} for i in range(8)]
    async with httpx.AsyncClient(base_url=batch_url, timeout=60) as http:
        uploaded = (await http.post("/v1/files", data={"purpose": "batch"},
                                    files={"file": ("long.jsonl", jsonl(lines))})).json()  # fmt: skip
        created = await http.post("/v1/batches", json={"input_file_id": uploaded["id"],
                                  "endpoint": "/v1/chat/completions", "completion_window": "24h"})  # fmt: skip
        batch_id = created.json()["id"]
        await batch_tab.open("batches")
        row = page.locator(f'tr[data-batch="{batch_id}"]')
        status = row.locator('td[data-col="status"] .state')
        await expect(status).to_have_text("in_progress", timeout=30_000)
        await row.get_by_role("button", name=f"Cancel {batch_id}").click()
        await expect(status).to_have_text(re.compile(r"^cancell(ing|ed)$"))
        await expect(status).to_have_text("cancelled", timeout=120_000)
        await expect(row.get_by_role("button", name=f"Cancel {batch_id}")).to_be_hidden()
        ended = (await http.get(f"/v1/batches/{batch_id}")).json()
    assert ended["status"] == "cancelled" and ended["request_counts"]["completed"] < 8
