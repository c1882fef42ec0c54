"""The HRM serving contract and server-wide generation defaults on the real SmolLM2 GGUF.

HRM's v1 bodies carry no `model` (issue 31): `/generate` and `/loglikelihood` then use the
server's default for the task, or the only model that does it. Its defaults (max_tokens
128, temperature 0.7) are set server-wide (`defaults.sampling`) and reach every generation
route; precedence: the request, the model's `sampling`, the server's, the protocol's.
One small app (the chat model alone) serves every test here; `ignore_eos` makes each
generation run to its cap, so the cap in effect is what the usage counts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import CHAT_MODEL, sdk, serving

SERVER_CAP = 3
"""`defaults.sampling.max_tokens` here: small, so every route's reply is short."""


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    cli = {"enabled_models": [CHAT_MODEL], "defaults": {"sampling": {"max_tokens": SERVER_CAP, "temperature": 0.7}}}
    async with serving(cli) as (_, http):
        yield http


async def test_generate_without_model_uses_the_only_completion_model(client: httpx.AsyncClient) -> None:
    # HRM's v1 /generate body: prompts and sampling, no `model`.
    reply = await client.post("/generate", json={"prompts": ["Once upon a time"], "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == CHAT_MODEL
    assert body["usage"]["completion_tokens"] == SERVER_CAP  # the server's default, not /generate's own 16
    assert body["finish_reasons"] == ["length"]
    capped = await client.post("/generate", json={"prompts": ["Once"], "max_tokens": 2, "ignore_eos": True})
    assert capped.json()["usage"]["completion_tokens"] == 2  # the request wins


async def test_loglikelihood_without_model_uses_the_only_scoring_model(client: httpx.AsyncClient) -> None:
    reply = await client.post("/loglikelihood", json={"prompts": ["The capital of France is"],
                                                      "continuations": [" Paris"]})  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == CHAT_MODEL and reply.json()["ll"][0] < 0


async def test_the_server_default_reaches_chat_completions_and_responses(client: httpx.AsyncClient) -> None:
    oai = sdk(client)
    chat = await oai.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Tell me a story"}], extra_body={"ignore_eos": True}
    )
    assert chat.usage is not None and chat.usage.completion_tokens == SERVER_CAP
    text = await oai.completions.create(model=CHAT_MODEL, prompt="Once upon", extra_body={"ignore_eos": True})
    assert text.usage is not None and text.usage.completion_tokens == SERVER_CAP  # not OpenAI's 16
    response = await oai.responses.create(
        model=CHAT_MODEL, input="Tell me a story", extra_body={"decoding": {"ignore_eos": True}}
    )
    assert response.usage is not None and response.usage.output_tokens == SERVER_CAP
    own = await oai.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, extra_body={"ignore_eos": True}
    )
    assert own.usage is not None and own.usage.completion_tokens == 1


async def read_events(client: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    async with client.stream("POST", "/generate_stream", json=body) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in reply.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


async def test_generate_stream_streams_what_generate_returns(client: httpx.AsyncClient) -> None:
    """HRM's `/generate_stream`: `/generate`'s body (no `model`), its text as server-sent
    events per prompt `index`, then the usage; greedy, so the same text as `/generate`."""
    body = {"prompts": ["Once upon a time", "The capital of France"], "temperature": 0, "ignore_eos": True}
    whole = (await client.post("/generate", json=body)).json()
    events = await read_events(client, body)
    pieces, last = events[:-1], events[-1]
    texts = ["".join(e["text"] for e in pieces if e["index"] == i) for i in range(2)]
    assert texts == whole["completions"]
    ends = [e["finish_reason"] for e in pieces if e["finish_reason"] is not None]
    assert ends == whole["finish_reasons"] == ["length", "length"]
    assert last == {"model": CHAT_MODEL, "usage": whole["usage"]}
    assert last["usage"]["completion_tokens"] == 2 * SERVER_CAP  # the server's default reaches it too


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompts": []}, "prompts"),
        ({"prompts": ["a"] * 1025}, "prompts"),
        ({"prompts": [5]}, "prompts"),
        ({"prompts": ["a"], "max_tokens": 0}, "max_tokens"),
        ({"prompts": ["a"], "temperature": 9}, "temperature"),
        ({"prompts": ["a"], "json_schema": {"type": "object"}}, "json_schema"),
        ({"prompts": ["a"], "model": "nope"}, "model"),
        ({"prompts": ["a"], "model": ""}, "model"),
    ],
)
async def test_generate_stream_refuses_bad_bodies_before_streaming(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    reply = await client.post("/generate_stream", json=body)
    assert reply.status_code in (400, 404), reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert param in reply.text and reply.json()["error"]["message"]
