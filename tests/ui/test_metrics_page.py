"""The metrics page in a real browser: charts drawn from the server's own metrics history
show a request rate and a latency while requests arrive."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import httpx
from playwright.async_api import expect

from tests.ui.conftest import Tab

EMBED_MODEL = "all-minilm-l6-v2"


@contextlib.asynccontextmanager
async def steady_requests(base_url: str) -> AsyncIterator[list[int]]:
    """Embedding requests, one after another (each waits for the last one's answer), while
    the block runs, so every 2 s interval the sampler closes has some; yields their statuses."""
    statuses: list[int] = []

    async def send(http: httpx.AsyncClient) -> None:
        while True:
            body = {"model": EMBED_MODEL, "input": [f"request {len(statuses)}", "the workbench charts"]}
            statuses.append((await http.post("/v1/embeddings", json=body)).status_code)

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        task = asyncio.create_task(send(http))
        try:
            yield statuses
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_charts_show_the_request_rate_and_latency(tab: Tab, ui_url: str) -> None:
    page = tab.page
    async with steady_requests(ui_url) as statuses:
        await tab.open("metrics")
        rate = page.get_by_role("img", name=re.compile(r"^Request rate"))
        # Non-zero: a digit 1-9 somewhere in the latest rate ("0.50 requests/s", "12.0 requests/s").
        nonzero = re.compile(r"Latest: (?=[\d.]*[1-9])[\d.]+ requests/s")
        await expect(rate).to_have_accessible_name(nonzero, timeout=20_000)
        await expect(page.locator("#chart-requests-latest")).to_contain_text("requests/s")
        latency = page.get_by_role("img", name=re.compile(r"^Latency"))
        await expect(latency).to_have_accessible_name(re.compile(r"Latest: p50 [\d.]+ m?s, p99 [\d.]+ m?s"))
        await expect(page.locator("#chart-latency-latest")).to_have_text(re.compile(r"^p50 [\d.]+ m?s, p99"))
        memory = page.get_by_role("img", name=re.compile(r"^Memory"))
        await expect(memory).to_have_accessible_name(
            re.compile(r"Latest: RSS [\d.]+ (MiB|GiB): runtimes [\d.]+ (B|KiB|MiB|GiB), \d+ models [\d.]+ \w+ measured")
        )
        await expect(page.locator("#chart-requests svg path.series-0")).not_to_have_count(0)
        await expect(page.locator("#chart-requests svg .tick").first).to_be_visible()
        await page.get_by_label("Time range").select_option(label="1 minute")
        await expect(page.locator("#chart-requests svg .tick").last).to_have_text(re.compile(r"\d"))
        # A few more samples under load, so the screenshot shows lines rather than a dot.
        await expect(page.locator(".metrics-head .summary")).to_have_text(
            re.compile(r"^([89]|\d\d+) samples"), timeout=30_000
        )
        await tab.screenshot("metrics")
        async with httpx.AsyncClient(base_url=ui_url) as http:
            history = (await http.get("/metrics/history")).json()
    assert statuses and set(statuses) == {200}
    assert history["interval_s"] == 2.0 and history["window_s"] == 900.0
    busy = [point for point in history["points"] if point["requests_per_s"] > 0]
    assert busy and all(point["latency_p50_s"] > 0 for point in busy)
    assert all(point["latency_p99_s"] >= point["latency_p50_s"] for point in busy)
    # The memory chart's parts add up: the models' measured shares and the runtimes are in the RSS.
    assert all(p["runtimes_bytes"] + p["memory_measured_bytes"] <= p["process_rss_bytes"] for p in history["points"])
    # `since` answers what is after it: from the third newest point on, the two newer ones
    # (and any sampled since the first request), never the whole window nor nothing.
    points = history["points"]
    since = points[-3]["t"]
    async with httpx.AsyncClient(base_url=ui_url) as http:
        later = (await http.get("/metrics/history", params={"since": since})).json()["points"]
    assert later[:2] == points[-2:] and all(point["t"] > since for point in later)
