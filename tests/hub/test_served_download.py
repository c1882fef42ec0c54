"""A served model whose `hf:` weights are not cached: its load first downloads them, and the
download is a state everyone can see — `downloading` with bytes done/total in /v1/models and
the admin status, a 503 with the progress and Retry-After for requests meanwhile, refused
before any byte when it could never fit the budget, cancelled by an unload. Real server
(in-process app), real huggingface_hub client, the stand-in hub, the official OpenAI SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import hub_repos as r
from tests.conftest import sdk, serving
from tests.hub_standin import HubStandin
from tests.polling import until_answered

REPO = "standin/served-GGUF"
FILE = r.gguf_name("Q4_K_M")
MODEL = "hubbed"


@pytest.fixture
def hub(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    """A hub of this test's own (its gates and its fetch log), with one GGUF repo."""
    with HubStandin() as standin:
        standin.add_commit(REPO, {FILE: r.smollm2_gguf(), "README.md": b"# served\n"})
        monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
        yield standin


def _config(cache: Path, **pool: Any) -> dict[str, Any]:
    model = {"backend": "llama_cpp", "source": f"hf:{REPO}:Q4_K_M", "preload": False, "options": {"n_ctx": 512}}
    return {"enabled_models": [MODEL], "models": {MODEL: model}, "hf_cache_dir": str(cache), "pool": pool}


async def _listed(client: httpx.AsyncClient) -> dict[str, Any]:
    models = (await client.get("/v1/models")).json()["data"]
    found: dict[str, Any] = next(m for m in models if m["id"] == MODEL)
    return found


def _complete_ggufs(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*.gguf") if p.is_file()]


async def test_download_progress_is_visible_and_unload_cancels_it(hub: HubStandin, hub_env: Path) -> None:
    gate = hub.hold(FILE, after_bytes=40_000_000)
    async with serving(_config(hub_env)) as (app, client):
        with pytest.raises(openai.APIStatusError) as waiting:
            await sdk(client).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert waiting.value.status_code == 503
        assert "downloading its weights" in waiting.value.message
        assert int(waiting.value.response.headers["retry-after"]) >= 1

        async def midway() -> bool:
            listed = await _listed(client)
            return listed["state"] == "downloading" and listed["download"]["done_bytes"] > 0

        await until_answered(midway, "the download's progress in /v1/models", timeout_s=60)
        listed = await _listed(client)
        size = r.smollm2_gguf().stat().st_size
        assert listed["download"]["total_bytes"] == size and listed["download"]["done_bytes"] < size
        assert listed["download"]["file"] == FILE and 0 < listed["download"]["percent"] < 100
        admin = (await client.get(f"/v1/admin/models/{MODEL}/status")).json()
        assert admin["state"] == "downloading" and admin["download"]["total_bytes"] == size

        slot = next(s for s in app.state.pool.slots() if s.id == MODEL)
        download = slot.download
        unloading = client.post(f"/v1/admin/models/{MODEL}/unload", json={})
        task = asyncio.ensure_future(unloading)
        await until_answered(_is_set(download), "the unload to cancel the download")
        gate.release()  # bytes flow again: the next chunk meets the cancel
        assert (await task).status_code == 200
        listed = await _listed(client)
        assert listed["state"] == "unloaded" and "download" not in listed and listed["error"] is None
        assert _complete_ggufs(hub_env) == []  # nothing left that looks complete


def _is_set(download: Any) -> Any:
    async def check() -> bool:
        return bool(download.cancel_event.is_set())

    return check


async def test_downloaded_model_then_serves(hub: HubStandin, hub_env: Path) -> None:
    async with serving(_config(hub_env)) as (_, client):
        oai = sdk(client)
        with pytest.raises(openai.APIStatusError, match="downloading its weights"):
            await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])

        async def ready() -> bool:
            return (await _listed(client))["state"] == "ready"

        await until_answered(ready, "the model to download and load", timeout_s=120)
        reply = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4, temperature=0
        )
        assert reply.choices[0].message.content
        assert hub.fetched_paths(REPO) == {FILE}  # the README stayed on the hub
        assert [p.name for p in _complete_ggufs(hub_env)] == [FILE]


async def test_a_model_that_can_never_fit_is_refused_before_downloading(hub: HubStandin, hub_env: Path) -> None:
    async with serving(_config(hub_env, memory_budget_bytes=50_000_000)) as (_, client):
        with pytest.raises(openai.APIStatusError) as refused:
            await sdk(client).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 503 and "not downloaded" in refused.value.message
        assert hub.fetched_paths(REPO) == set()
