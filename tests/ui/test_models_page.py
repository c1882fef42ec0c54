"""The models page in a real browser: the live table, the load form generated from each
option's schema, load and unload with the state changing on screen, engine logs, the
keep-alive countdown, and what a key without the admin scope sees."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from modelpool.config import load_config
from modelpool.config.schema import AuthConfig
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.e2e.conftest import smollm2_gguf
from tests.live_server import live_server
from tests.polling import until
from tests.ui.conftest import Tab, open_tab

MODEL = "whisper-base"  # on demand in the shared app: this file loads it and unloads it again
ENGINE = "smollm2-engine"
SPEECH = "piper-en-us-joe"
LOAD_S = 90_000  # ms: a load on two busy cores
APP_KEY, OPS_KEY = "sk-ui-app", "sk-ui-ops"
APP_RPM = 3


def cell(page: Page, model: str, column: str) -> Any:
    return page.locator(f'tr[data-model="{model}"] td[data-col="{column}"]')


async def use_key(page: Page, key: str) -> None:
    """Answer the key dialog, which opens by itself when the server asks for a key."""
    dialog = page.get_by_role("dialog", name="API key")
    await expect(dialog).to_be_visible(timeout=10_000)
    await dialog.get_by_label("Key").fill(key)
    await dialog.get_by_role("button", name="Use key").click()
    await expect(dialog).to_be_hidden()


@pytest.fixture(scope="module")
async def keyed_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A server that checks keys ('app': inference only; 'ops': admin too), with nothing
    preloaded so it starts at once: piper with a keep-alive, and SmolLM2 as an engine process."""
    models: dict[str, Any] = {
        SPEECH: {"preload": False, "keep_alive": "10m"},
        ENGINE: {"backend": "llama_server", "source": str(smollm2_gguf()), "preload": False,
                 "options": {"context_length": 2048, "stop_grace_s": 5}},
    }  # fmt: skip
    state_dir = tmp_path_factory.mktemp("keyed-ui")
    # The app key's budget is small: the read-only page's polling must not spend it.
    holders = [{"name": "app", "scopes": ["inference"], "key_env": "APP_KEY", "requests_per_minute": APP_RPM},
               {"name": "ops", "scopes": ["admin", "inference"], "key_env": "OPS_KEY"}]  # fmt: skip
    cli = {"enabled_models": list(models), "models": models, "state_dir": str(state_dir), "auth": {"keys": holders}}
    keys = KeyRing.from_config(AuthConfig.model_validate({"keys": holders}), {"APP_KEY": APP_KEY, "OPS_KEY": OPS_KEY})
    async with live_server(create_app(load_config(None, cli=cli, environ={}), keys=keys)) as url:
        yield url


@pytest.fixture
async def keyed_tab(browser: Browser, keyed_url: str) -> AsyncIterator[Tab]:
    async for opened in open_tab(browser, keyed_url):
        opened.expect_status(401, 403)  # asking without a key, and the app key on the admin API
        yield opened


async def restore(http: httpx.AsyncClient, beam_size: int) -> None:
    """Leave the shared app's whisper-base as this file found it: overrides outlive an unload."""
    status = (await http.get(f"/v1/admin/models/{MODEL}/status")).json()
    if status["options"].get("beam_size", beam_size) != beam_size:
        await http.post(f"/v1/admin/models/{MODEL}/load", json={"overrides": {"beam_size": beam_size}})
    await http.post(f"/v1/admin/models/{MODEL}/unload", json={"drain": True})


async def test_the_table_shows_every_model_live(tab: Tab) -> None:
    page = tab.page
    await tab.open("models")
    await expect(cell(page, "smollm2-135m-instruct", "state")).to_have_text("ready", timeout=10_000)
    await expect(cell(page, "smollm2-135m-instruct", "backend")).to_have_text("llama_cpp")
    await expect(cell(page, "smollm2-135m-instruct", "tasks")).to_contain_text("chat")
    await expect(cell(page, "smollm2-135m-instruct", "replicas")).to_have_text("1 / 1")
    await expect(cell(page, "smollm2-135m-instruct", "keep-alive")).to_have_text("never")
    await expect(cell(page, "all-minilm-l6-v2", "memory")).to_contain_text(re.compile(r"\d+(\.\d)? MiB"))
    await expect(cell(page, MODEL, "state")).to_have_text("unloaded")
    await expect(cell(page, "whisper-tiny.en", "tasks")).to_contain_text("audio")  # a capability, not a task


async def test_load_with_an_override_from_the_generated_form_then_unload(tab: Tab, ui_url: str) -> None:
    page = tab.page
    async with httpx.AsyncClient(base_url=ui_url, timeout=120) as http:
        before = (await http.get(f"/v1/admin/models/{MODEL}/status")).json()
        assert before["state"] == "unloaded"
        original = next(o["value"] for o in before["override_options"] if o["name"] == "beam_size")
        try:
            await tab.open("models")
            await page.get_by_role("button", name=f"Select {MODEL}").click()
            detail = page.locator("#model-detail")
            beam = detail.get_by_label("beam_size")
            await expect(beam).to_have_value(str(original))
            await expect(beam).to_have_attribute("min", "1")  # the bound from the backend's Options
            await expect(detail.get_by_label("vad_filter")).to_have_attribute("type", "checkbox")
            await expect(detail.get_by_label("Replicas")).to_have_attribute("max", str(before["replica_max"]))
            await beam.fill("0")
            await detail.get_by_role("button", name="Load", exact=True).click()
            await expect(detail.get_by_role("alert")).to_contain_text("beam_size")  # refused before sending
            await expect(cell(page, MODEL, "state")).to_have_text("unloaded")

            await beam.fill("2")
            await detail.get_by_role("button", name="Load", exact=True).click()
            await expect(cell(page, MODEL, "state")).to_have_text("ready", timeout=LOAD_S)
            await expect(detail.locator(".detail-head .state")).to_have_text("ready")
            loaded = (await http.get(f"/v1/admin/models/{MODEL}/status")).json()
            assert loaded["options"]["beam_size"] == 2
            assert {o["name"]: o["value"] for o in loaded["override_options"]}["beam_size"] == 2
            await expect(beam).to_have_value("2")  # the form now shows what the model runs with
            await expect(detail.get_by_role("alert")).to_have_text("")
            await expect(detail).to_contain_text("No engine process")
            await tab.screenshot("models")

            await detail.get_by_role("button", name="Unload (drain)").click()
            await expect(cell(page, MODEL, "state")).to_have_text("unloaded", timeout=30_000)
            await expect(cell(page, MODEL, "replicas")).to_have_text("0 / 1")
        finally:
            await restore(http, original)


async def test_an_inference_key_sees_the_refusal_and_the_read_only_list(keyed_tab: Tab) -> None:
    page = keyed_tab.page
    await keyed_tab.open("models")
    await use_key(page, APP_KEY)
    refusal = page.get_by_role("alert").filter(has_text="Admin view")
    await expect(refusal).to_contain_text("This API key ('app') lacks the 'admin' scope.", timeout=10_000)
    listed = page.get_by_role("region", name="Models (read-only)")
    await expect(listed.locator(f'tr[data-model="{SPEECH}"]')).to_contain_text("speech")
    await expect(listed.locator(f'tr[data-model="{ENGINE}"]')).to_contain_text("unloaded")
    await expect(page.get_by_role("button", name=f"Select {ENGINE}")).to_have_count(0)
    await expect(page.get_by_role("button", name="Load", exact=True)).to_have_count(0)


async def test_read_only_polling_spends_no_budget_and_a_refused_key_stops_it(keyed_tab: Tab, keyed_url: str) -> None:
    page = keyed_tab.page
    listings: list[str] = []
    page.on("request", lambda request: listings.append(request.url) if request.url.endswith("/v1/models") else None)
    await keyed_tab.open("models")
    await use_key(page, APP_KEY)
    listed = page.get_by_role("region", name="Models (read-only)")
    await expect(listed.locator(f'tr[data-model="{SPEECH}"]')).to_be_visible(timeout=10_000)
    # More polls than the key may make requests in a minute: none is refused, none is counted.
    await until(lambda: len(listings) > APP_RPM + 1, "the page to poll past the key's limit", timeout_s=30)
    await expect(page.locator("#notice")).to_be_empty()
    headers = {"Authorization": f"Bearer {OPS_KEY}"}
    async with httpx.AsyncClient(base_url=keyed_url, headers=headers, timeout=30) as http:
        usage = (await http.get("/v1/admin/usage")).json()["data"]
    app = next(row for row in usage if row["key"] == "app")
    assert (app["requests"], app["rate_limited"]) == (0, 0)

    # The key stops being accepted (here: the stored one changes): the page asks once, and
    # stops polling until a key is given, rather than reopening the dialog every 2 s.
    await page.evaluate("() => sessionStorage.setItem('modelpool.key', 'sk-no-longer-valid')")
    dialog = page.get_by_role("dialog", name="API key")
    await expect(dialog).to_be_visible(timeout=10_000)
    await expect(page.get_by_role("alert").filter(has_text="API key needed")).to_be_visible()
    await dialog.get_by_role("button", name="Cancel").click()
    asked = len(listings)
    await page.wait_for_timeout(4_500)  # an absence: more than two poll intervals pass unpolled
    await expect(dialog).to_be_hidden()
    assert len(listings) == asked


async def test_a_malformed_address_falls_back_to_the_list(tab: Tab) -> None:
    page = tab.page
    await tab.open("models/%E0%A4%A")  # not UTF-8 once decoded: decodeURIComponent throws
    await expect(cell(page, "smollm2-135m-instruct", "state")).to_have_text("ready", timeout=10_000)
    await expect(page.locator("#model-detail")).to_have_count(0)


async def test_an_admin_key_loads_an_engine_model_and_reads_its_logs(keyed_tab: Tab) -> None:
    page = keyed_tab.page
    keyed_tab.expect_status(400)  # the refused load below
    await keyed_tab.open("models")
    await use_key(page, OPS_KEY)
    await expect(cell(page, ENGINE, "keep-alive")).to_have_text("never", timeout=10_000)
    await page.get_by_role("button", name=f"Select {ENGINE}").click()
    detail = page.locator("#model-detail")
    await expect(detail.locator(".logs")).to_contain_text("No engine process is running")
    extra = detail.get_by_label("extra_args")  # a list: a JSON text area
    await expect(extra).to_have_value("[]")
    await extra.fill('{"not": "a list"}')
    await detail.get_by_role("button", name="Load", exact=True).click()
    # Valid JSON but not a list: the API's 400 names it, next to the form.
    await expect(detail.get_by_role("alert")).to_contain_text(re.compile(r"extra_args.*list"), timeout=10_000)
    await extra.fill("[]")
    # The typed knobs (issue 32) with their choices and bounds from the backend's Options.
    type_v = detail.get_by_label("type_v")
    await expect(type_v.locator("option")).to_have_text(["(automatic)", "f32", "f16", "bf16", "q8_0", "q4_0",
                                                          "q4_1", "iq4_nl", "q5_0", "q5_1"])  # fmt: skip
    await expect(detail.get_by_label("draft_max_tokens")).to_have_attribute("max", "128")
    await type_v.select_option(label="q8_0")
    await detail.get_by_label("flash_attention").select_option(label="off")
    await detail.get_by_role("button", name="Load", exact=True).click()
    await expect(detail.get_by_role("alert")).to_contain_text("needs flash attention", timeout=10_000)
    await detail.get_by_label("type_k").select_option(label="q8_0")
    await detail.get_by_label("flash_attention").select_option(label="on")
    await detail.get_by_label("context_length").fill("1024")
    await detail.get_by_role("button", name="Load", exact=True).click()
    await expect(cell(page, ENGINE, "state")).to_have_text("ready", timeout=LOAD_S)
    await expect(detail.get_by_label("type_v")).to_have_value('"q8_0"')
    await expect(detail.locator(".logs h4")).to_contain_text(re.compile(r"Replica 0 · pid \d+"), timeout=10_000)
    await expect(detail.locator(".logs pre")).to_contain_text("Uvicorn running", timeout=10_000)
    await expect(detail.get_by_label("context_length")).to_have_value("1024")
    await detail.get_by_role("button", name="Unload (force)").click()
    await expect(cell(page, ENGINE, "state")).to_have_text("unloaded", timeout=30_000)
    await expect(detail.locator(".logs")).to_contain_text("No engine process is running", timeout=10_000)


def seconds_left(text: str) -> int:
    found = re.fullmatch(r"(?:(\d+) min )?(\d+) s", text.strip())
    assert found, f"not a countdown: {text!r}"
    return int(found.group(1) or 0) * 60 + int(found.group(2))


async def test_the_keep_alive_countdown_decreases(keyed_tab: Tab, keyed_url: str) -> None:
    headers = {"Authorization": f"Bearer {OPS_KEY}"}
    async with httpx.AsyncClient(base_url=keyed_url, headers=headers, timeout=120) as http:
        assert (await http.post(f"/v1/admin/models/{SPEECH}/load")).status_code == 200
        try:
            page = keyed_tab.page
            await keyed_tab.open("models")
            await use_key(page, OPS_KEY)
            countdown = cell(page, SPEECH, "keep-alive")
            await expect(countdown).to_have_text(re.compile(r"^\d+ min \d+ s$"), timeout=10_000)
            first = seconds_left(await countdown.inner_text())
            assert 540 < first <= 600  # 10 minutes, just loaded
            await expect(countdown).not_to_have_text(await countdown.inner_text(), timeout=5_000)
            second = seconds_left(await countdown.inner_text())
            assert second < first
        finally:
            await http.post(f"/v1/admin/models/{SPEECH}/unload")
