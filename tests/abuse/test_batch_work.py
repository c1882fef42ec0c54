"""Work never outlives its request: a batch route (`/generate`) whose prompt fails, or whose
client leaves, stops all its generations before it answers, and a batch counts against
admission as the generations it runs at once, not as one request.

The attack (issue 27's table): 30 long prompts and one out-of-vocabulary token id to
`/generate` got a 400 in 40 ms, and the next 2-token request waited 66 s behind 30
generations that kept running for nobody, outside admission and the token budget."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import FastAPI

from modelpool.config.schema import AuthConfig
from modelpool.server.auth import KeyRing
from tests.conftest import CHAT_MODEL, serving
from tests.polling import until

LONG_PROMPT = "Once upon a time, in a kingdom by the sea, there lived a curious young inventor. " * 18
"""~1500 characters (~330 tokens): prefilled on the engine, tokenized inline."""


def engine_of(app: FastAPI):  # the llama.cpp engine of the starter chat model's one replica
    return app.state.pool.slot(CHAT_MODEL).replicas.members[0].backend._engine


def generate_body(prompts: list[str | list[int]], max_tokens: int) -> dict[str, object]:
    return {"model": CHAT_MODEL, "prompts": prompts, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


async def test_a_bad_prompt_in_a_batch_stops_every_sibling_and_the_next_request_is_served_at_once(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    engine = engine_of(app)
    await until(lambda: engine.in_flight == 0, "an idle engine before the attack", timeout_s=60)
    prompts: list[str | list[int]] = [f"{i}: {LONG_PROMPT}" for i in range(30)]
    prompts.append([1, 2, 10_000_000])  # the out-of-vocabulary token id

    response = await http.post("/generate", json=generate_body(prompts, 512))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "prompt"
    # Nothing of the batch runs on once it has been answered (before: 30 generations of 512 tokens).
    await until(lambda: engine.in_flight == 0, "the batch's generations to leave the engine", timeout_s=10)
    assert app.state.pool.slot(CHAT_MODEL).admission.running == 0

    started = time.monotonic()
    short = await http.post("/generate", json=generate_body(["Hi"], 2))
    elapsed = time.monotonic() - started
    assert short.status_code == 200, short.text
    assert short.json()["usage"]["completion_tokens"] == 2
    assert elapsed < 10, f"the next 2-token request took {elapsed:.1f} s (66 s before the fix)"


async def test_a_batch_client_that_leaves_stops_every_generation(app: FastAPI, http: httpx.AsyncClient) -> None:
    engine = engine_of(app)
    await until(lambda: engine.in_flight == 0, "an idle engine", timeout_s=60)
    request = asyncio.create_task(http.post("/generate", json=generate_body([LONG_PROMPT] * 4, 1500)))
    await until(lambda: engine.in_flight == 4, "the batch's 4 generations in the engine", timeout_s=30)
    request.cancel()  # the client goes away
    await asyncio.gather(request, return_exceptions=True)
    await until(lambda: engine.in_flight == 0, "the abandoned batch's generations to leave the engine", timeout_s=10)
    assert app.state.pool.slot(CHAT_MODEL).admission.running == 0


async def test_a_batch_counts_against_admission_as_its_size(app: FastAPI, http: httpx.AsyncClient) -> None:
    admission = app.state.pool.slot(CHAT_MODEL).admission
    engine = engine_of(app)
    await until(lambda: engine.in_flight == 0 and admission.running == 0, "an idle model", timeout_s=60)
    turns = admission.turns
    batch = asyncio.create_task(http.post("/generate", json=generate_body(["Tell me a story."] * 3, 48)))
    await until(lambda: admission.running > 0, "the batch to be let in")
    assert admission.running == 3  # three turns, not one
    models = (await http.get("/v1/admin/models")).json()["data"]
    assert next(m["in_flight"] for m in models if m["id"] == CHAT_MODEL) == 3
    # A batch as big as the model waits for all its turns, although only one request runs.
    whole = asyncio.create_task(http.post("/generate", json=generate_body(["Hi"] * (turns + 5), 2)))
    await until(lambda: admission.waiting == 1, "the big batch to wait in line")
    assert admission.running == 3
    first, second = await asyncio.gather(batch, whole)
    assert first.status_code == 200 and second.status_code == 200
    assert len(second.json()["completions"]) == turns + 5
    assert admission.running == 0 and admission.waiting == 0


async def test_everything_a_failed_batch_generated_is_charged_to_its_caller() -> None:
    """The token budget sees the whole batch: no generation of it runs on after the answer,
    uncounted (before: the pool's token counters grew long after the key's usage was booked)."""
    auth = {"keys": [{"name": "eval", "key_env": "EVAL", "scopes": ["inference"], "tokens_per_minute": 1_000_000},
                     {"name": "ops", "key_env": "OPS", "scopes": ["admin"]}]}  # fmt: skip
    keys = KeyRing.from_config(AuthConfig.model_validate(auth), {"EVAL": "sk-eval", "OPS": "sk-ops"})
    ops = {"Authorization": "Bearer sk-ops"}
    async with serving({"enabled_models": [CHAT_MODEL], "auth": auth}, keys=keys) as (app, http):
        await app.state.pool.slot(CHAT_MODEL).ensure_ready(None)
        engine = engine_of(app)
        prompts: list[str | list[int]] = [f"{i}: Tell me a long story." for i in range(6)]
        prompts.append([1, 2, 10_000_000])
        answer = await http.post("/generate", json=generate_body(prompts, 256), headers={"x-api-key": "sk-eval"})
        assert answer.status_code == 400, answer.text
        await until(lambda: engine.in_flight == 0, "the batch's generations to leave the engine", timeout_s=10)

        async def usage() -> dict[str, object]:
            rows = (await http.get("/v1/admin/usage", headers=ops)).json()["data"]
            return next(row for row in rows if row["key"] == "eval")

        async def pool_tokens(kind: str) -> float:
            text = (await http.get("/metrics", headers=ops)).text
            lines = [line for line in text.splitlines() if line.startswith(f"modelpool_{kind}_tokens_total{{")]
            return sum(float(line.rsplit(" ", 1)[1]) for line in lines)  # no line: none counted yet

        row = await usage()
        assert row["requests"] == 1
        assert (await pool_tokens("input"), await pool_tokens("output")) == (row["input_tokens"], row["output_tokens"])
