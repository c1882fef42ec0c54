"""The models table's queue by priority class, in a real browser: the starter SmolLM2 at one
turn, held by a long stream, with requests of a high-priority and a low-priority key waiting
behind it (as tests/e2e/test_fair_scheduling.py holds them: no clocks, no sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, expect

from modelpool.config import load_config
from modelpool.config.schema import AuthConfig
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.conftest import CHAT_MODEL
from tests.live_server import live_server
from tests.polling import until_answered
from tests.ui.conftest import Tab, open_tab
from tests.ui.test_models_page import cell, use_key

SECRETS = {"OPS_KEY": "sk-q-ops", "VIP_KEY": "sk-q-vip", "NIGHTLY_KEY": "sk-q-nightly"}
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
async def queue_url() -> AsyncIterator[str]:
    holders = [{"name": "ops", "key_env": "OPS_KEY", "scopes": ["admin", "inference"]},
               {"name": "vip", "key_env": "VIP_KEY", "priority": "high"},
               {"name": "nightly", "key_env": "NIGHTLY_KEY", "priority": "low"}]  # fmt: skip
    # One turn, and a context long enough for a blocker that outlasts the test on a fast machine.
    options = {"n_ctx": 8192, "parallel": 1}
    models: dict[str, Any] = {CHAT_MODEL: {"max_concurrency": 1, "max_queue": 8, "options": options}}
    cli = {"enabled_models": [CHAT_MODEL], "models": models, "auth": {"keys": holders}}
    keys = KeyRing.from_config(AuthConfig.model_validate({"keys": holders}), SECRETS)
    async with live_server(create_app(load_config(None, cli=cli, environ={}), keys=keys)) as url:
        yield url


@pytest.fixture
async def queue_tab(browser: Browser, queue_url: str) -> AsyncIterator[Tab]:
    async for opened in open_tab(browser, queue_url):
        opened.expect_status(401)  # the first ask, before the key is entered
        yield opened


def asker(url: str, env: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {SECRETS[env]}"}, timeout=300)


async def queued_by_priority(http: httpx.AsyncClient) -> dict[str, int]:
    listed = (await http.get("/v1/admin/models")).json()["data"]
    by_priority: dict[str, int] = next(m for m in listed if m["id"] == CHAT_MODEL)["queued_by_priority"]
    return by_priority


async def test_the_queue_shows_its_requests_by_priority_class(queue_tab: Tab, queue_url: str) -> None:
    chat = {"model": CHAT_MODEL, "messages": HI, "max_tokens": 8, "ignore_eos": True}
    # The blocker holds the only turn until it is closed (7000 tokens: a minute at least).
    long = {**chat, "max_tokens": 7000, "stream": True}
    async with contextlib.AsyncExitStack() as held:
        ops, vip, vip2, nightly = [await held.enter_async_context(asker(queue_url, env))
                                   for env in ("OPS_KEY", "VIP_KEY", "VIP_KEY", "NIGHTLY_KEY")]  # fmt: skip
        blocker = await held.enter_async_context(ops.stream("POST", "/v1/chat/completions", json=long))
        lines = blocker.aiter_lines()
        await lines.__anext__()  # it is generating
        # Read on: a reader that stops reading loses its turn after the send timeout.
        reading = asyncio.create_task(_drain(lines))
        waiting = [asyncio.create_task(client.post("/v1/chat/completions", json=chat))
                   for client in (vip, vip2, nightly)]  # fmt: skip

        async def all_queued() -> bool:
            return await queued_by_priority(ops) == {"high": 2, "normal": 0, "low": 1}

        try:
            await until_answered(all_queued, "the requests to queue", timeout_s=60)
            page = queue_tab.page
            await queue_tab.open("models")
            await use_key(page, SECRETS["OPS_KEY"])
            queued = cell(page, CHAT_MODEL, "queued")
            await expect(queued).to_contain_text("3", timeout=10_000)
            await expect(queued.locator(".queued-classes")).to_have_text("2 high · 1 low")
        finally:
            reading.cancel()
            await blocker.aclose()  # the turn goes to the line; the waiting requests finish
            answers = await asyncio.gather(*waiting)
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        await expect(queued).to_have_text("0", timeout=10_000)  # an empty queue names no class


async def _drain(lines: AsyncIterator[str]) -> None:
    async for _ in lines:
        pass
