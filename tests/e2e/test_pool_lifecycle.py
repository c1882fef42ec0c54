"""The pool with the real starter models: on-demand loads, one load for concurrent first
requests, eviction under a budget, 429 on overflow, replicas, idle unload, drain, admin."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from modelpool.errors import ModelUnloaded
from modelpool.inference import ChatMessage, ChatRequest, SamplingParams
from modelpool.pool_api.generation import collect
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STARTER_IDS, sdk, serving
from tests.polling import until

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
# ignore_eos: a sampled story may end early on some machine; this one surely runs 400 tokens.
LONG = ChatRequest(
    (ChatMessage("user", "Write a very long story about the sea."),), SamplingParams(max_tokens=400, ignore_eos=True)
)


def on_demand(**chat: object) -> dict[str, object]:
    """The starter catalog with nothing preloaded (so budgets and load counts are the test's
    own); extra settings for the chat model."""
    models: dict[str, object] = {model: {"preload": False} for model in STARTER_IDS}
    return {"models": {**models, CHAT_MODEL: {"preload": False, **chat}}}


async def admin_models(client: httpx.AsyncClient) -> dict[str, dict]:
    response = await client.get("/v1/admin/models")
    assert response.status_code == 200
    return {m["id"]: m for m in response.json()["data"]}


async def test_first_request_loads_the_model_once_for_all_concurrent_callers() -> None:
    async with serving(on_demand(max_concurrency=4)) as (app, client):
        assert (await admin_models(client))[CHAT_MODEL]["state"] == "unloaded"
        oai = sdk(client)
        replies = await asyncio.gather(
            *(
                oai.chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=4, extra_body={"min_tokens": 1})
                for _ in range(4)
            )  # min_tokens: a sampled end-of-sequence first would leave no text
        )
        assert all(r.choices[0].message.content for r in replies)
        metrics = app.state.pool.metrics.registry
        assert metrics.get_sample_value("modelpool_model_load_seconds_count", {"model": CHAT_MODEL}) == 1
        model = (await admin_models(client))[CHAT_MODEL]
        assert model["state"] == "ready" and model["replicas"][0]["served"] == 4
        assert model["load_seconds"] > 0 and model["memory"]["measured_bytes"] > 0


async def test_a_small_budget_evicts_the_idle_model() -> None:
    async with serving({**on_demand(), "pool": {"max_loaded_models": 1}}) as (_, client):
        oai = sdk(client)
        await oai.chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=2)
        await oai.embeddings.create(model=EMBED_MODEL, input="evict the chat model")
        states = {k: v["state"] for k, v in (await admin_models(client)).items()}
        assert (states[CHAT_MODEL], states[EMBED_MODEL]) == ("unloaded", "ready")
        await oai.chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=2)  # and back
        states = {k: v["state"] for k, v in (await admin_models(client)).items()}
        assert (states[CHAT_MODEL], states[EMBED_MODEL]) == ("ready", "unloaded")


async def test_a_model_bigger_than_the_budget_gets_insufficient_capacity() -> None:
    async with serving({**on_demand(), "pool": {"memory_budget_bytes": "10MB"}}) as (_, client):
        response = await client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI})
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "insufficient_capacity" and "needs" in error["message"]
        assert (await client.get("/healthz")).status_code == 200  # and the server carries on


async def test_overflow_gets_429_at_once_and_the_queue_is_served_in_turn() -> None:
    async with serving(on_demand(max_concurrency=1, max_queue=1)) as (app, client):
        pool = app.state.pool
        running = await pool.chat(CHAT_MODEL, LONG)  # holds the only turn
        queued = asyncio.create_task(
            client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI, "max_tokens": 2})
        )
        await until(lambda: pool.slot(CHAT_MODEL).admission.waiting > 0, "the request to queue")
        overflow = await client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI})
        assert overflow.status_code == 429
        assert overflow.json()["error"]["code"] == "overloaded" and int(overflow.headers["retry-after"]) >= 1
        await running.aclose()  # gives the turn to the queued request
        assert (await queued).status_code == 200


async def test_replicas_serve_side_by_side_under_one_public_id() -> None:
    async with serving(on_demand(replicas=2, max_concurrency=1)) as (_, client):
        oai = sdk(client)
        replies = await asyncio.gather(
            *(
                oai.chat.completions.create(
                    model=CHAT_MODEL, messages=HI, max_tokens=16, extra_body={"return_metrics": True}
                )
                for _ in range(2)
            )
        )
        assert {r.model for r in replies} == {CHAT_MODEL}
        # cast: the server adds its metrics to every reply (the SDK types extra fields as maybe none).
        assert {cast(dict[str, Any], r.model_extra)["metrics"]["replica"] for r in replies} == {0, 1}
        model = (await admin_models(client))[CHAT_MODEL]
        assert [r["served"] for r in model["replicas"]] == [1, 1]
        assert {m.id for m in (await oai.models.list()).data} == STARTER_IDS


async def test_keep_alive_zero_unloads_after_the_request() -> None:
    async with serving(on_demand()) as (app, client):
        await sdk(client).embeddings.create(model=EMBED_MODEL, input="once", extra_body={"keep_alive": 0})
        slot = app.state.pool.slot(EMBED_MODEL)
        await until(lambda: slot.state.value == "unloaded", "the unload after the request", timeout_s=5)


async def test_idle_model_is_unloaded_by_the_reaper() -> None:
    cli = {**on_demand(keep_alive="1s"), "pool": {"reap_interval_s": 0.1}}
    async with serving(cli) as (app, client):
        await sdk(client).chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=2)
        assert (await admin_models(client))[CHAT_MODEL]["expires_in_s"] <= 1
        slot = app.state.pool.slot(CHAT_MODEL)
        await until(lambda: slot.state.value == "unloaded", "the reaper's unload", timeout_s=5)


async def test_unload_drains_running_work_then_force_cuts_it() -> None:
    async with serving(on_demand(max_concurrency=2)) as (app, client):
        pool = app.state.pool
        running = await pool.chat(CHAT_MODEL, LONG)
        unloading = asyncio.create_task(client.post(f"/v1/admin/models/{CHAT_MODEL}/unload", json={"drain": True}))
        # The unload starts a moment after the task does.
        await until(lambda: pool.slot(CHAT_MODEL).state.value == "unloading", "the drain to begin")
        assert not unloading.done()  # it waits for the running request: draining
        text = (await collect(running)).text
        assert text  # the running request finished whole
        response = await unloading
        assert response.status_code == 200 and response.json()["state"] == "unloaded"

        running = await pool.chat(CHAT_MODEL, LONG)
        forced = asyncio.create_task(client.post(f"/v1/admin/models/{CHAT_MODEL}/unload", json={"drain": False}))
        with pytest.raises(ModelUnloaded):
            await collect(running)
        assert (await forced).json()["state"] == "unloaded"


async def test_admin_load_with_overrides_and_replicas() -> None:
    async with serving(on_demand(replica_max=2)) as (_, client):
        loaded = await client.post(
            f"/v1/admin/models/{CHAT_MODEL}/load", json={"overrides": {"n_ctx": 256}, "replicas": 2}
        )
        assert loaded.status_code == 200, loaded.text
        model = loaded.json()
        assert model["state"] == "ready" and len(model["replicas"]) == 2 and model["options"]["n_ctx"] == 256
        too_long = await client.post("/v1/completions", json={"model": CHAT_MODEL, "prompt": "word " * 300})
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        bad = await client.post(f"/v1/admin/models/{CHAT_MODEL}/load", json={"overrides": {"bogus": 1}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "overrides"
        bad_value = await client.post(f"/v1/admin/models/{CHAT_MODEL}/load", json={"overrides": {"n_ctx": "big"}})
        assert bad_value.status_code == 400
        too_many = await client.post(f"/v1/admin/models/{CHAT_MODEL}/load", json={"replicas": 3})
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "replicas"
        memory = (await client.get("/v1/admin/memory")).json()
        assert memory["system"]["total_bytes"] > 0 and memory["models"][CHAT_MODEL]["measured_bytes"] > 0


async def test_autoload_off_is_409_until_an_admin_loads_it() -> None:
    async with serving(on_demand(autoload=False)) as (_, client):
        refused = await client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_not_loaded"
        assert (await client.post(f"/v1/admin/models/{CHAT_MODEL}/load")).status_code == 200
        ok = await client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI, "max_tokens": 2})
        assert ok.status_code == 200


async def test_timing_metrics_on_request_or_by_config() -> None:
    async with serving({"server": {"timing_metrics": True}, **on_demand()}) as (_, client):
        reply = (
            await client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI, "max_tokens": 4})
        ).json()
        metrics = reply["metrics"]
        assert metrics["output_tokens"] == reply["usage"]["completion_tokens"]
        assert metrics["backend_ms"] > 0 and metrics["time_to_first_token_ms"] <= metrics["backend_ms"]
        assert metrics["load_wait_ms"] > 0  # this request waited for the on-demand load
        embedded = (await client.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": "x"})).json()
        assert embedded["metrics"]["prompt_tokens"] == embedded["usage"]["prompt_tokens"]
        stream = await client.post(
            "/v1/chat/completions", json={"model": CHAT_MODEL, "messages": HI, "max_tokens": 3, "stream": True}
        )
        events = [e for e in stream.text.split("\n\n") if e.startswith("data: {")]
        assert '"metrics"' in events[-1] and all('"metrics"' not in e for e in events[:-1])


async def test_api_keys_and_scopes() -> None:
    from modelpool.config.schema import AuthConfig

    auth = AuthConfig.model_validate(
        {
            "keys": [
                {"name": "app", "scopes": ["inference"], "key_env": "APP_KEY"},
                {"name": "ops", "scopes": ["inference", "admin"], "key_env": "OPS_KEY"},
            ]
        }
    )
    from modelpool.server.auth import KeyRing

    keys = KeyRing.from_config(auth, {"APP_KEY": "sk-app", "OPS_KEY": "sk-ops"})
    async with serving(on_demand(), keys=keys) as (_, client):
        body = {"model": EMBED_MODEL, "input": "hi"}
        missing = await client.post("/v1/embeddings", json=body)
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        wrong = await client.post("/v1/embeddings", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await client.post("/v1/embeddings", json=body, headers={"Authorization": "Bearer sk-app"})
        assert ok.status_code == 200
        scope = await client.get("/v1/admin/models", headers={"Authorization": "Bearer sk-app"})
        assert scope.status_code == 403 and scope.json()["error"]["type"] == "permission_error"
        admin = await client.get("/v1/admin/models", headers={"Authorization": "Bearer sk-ops"})
        assert admin.status_code == 200
        assert (await client.get("/healthz")).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            await sdk(client, "nope").models.list()
        assert (await sdk(client, "sk-app").models.list()).data
