"""Rate limits and usage per API key, with the real starter models: 429s in each protocol's
shape with OpenAI's headers, budgets that come back as the (hand-moved) clock runs, and
usage in /v1/admin/usage and /metrics that adds up to what the responses said."""

from __future__ import annotations

import io
import json
import math
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from modelpool.config import load_config
from modelpool.config.schema import AuthConfig
from modelpool.runtime.ratelimit.limiter import duration_text
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.conftest import BASE_URL, CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL, sdk, serving
from tests.e2e.mcp_helpers import call, mcp_client
from tests.fakes import ManualClock
from tests.live_server import live_server
from tests.polling import until_answered

GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 1}
ASK = [{"role": "user", "content": "Name three colours."}]
SECRETS = {"LIMITED": "sk-limited", "OTHER": "sk-other", "BIG": "sk-big", "SMALL": "sk-small", "OPS": "sk-ops"}
LIMITED_KEY_HEADERS = {"Authorization": "Bearer sk-limited"}
OPS = {"Authorization": "Bearer sk-ops"}
OPENAI_HEADERS = [
    f"x-ratelimit-{what}-{kind}" for kind in ("requests", "tokens") for what in ("limit", "remaining", "reset")
]


def key(name: str, env: str, **limits: int) -> dict[str, Any]:
    return {"name": name, "key_env": env, "scopes": ["inference"], **limits}


def keyed(models: list[str], *keys: dict[str, Any]) -> tuple[dict[str, Any], KeyRing]:
    auth = {"keys": [*keys, {"name": "ops", "key_env": "OPS", "scopes": ["admin"]}]}
    return {"enabled_models": models, "auth": auth}, KeyRing.from_config(AuthConfig.model_validate(auth), SECRETS)


def frozen(app: FastAPI) -> ManualClock:
    """The app's limiter on a clock that moves only when the test says."""
    clock = ManualClock()
    app.state.rate_limiter.clock = clock
    return clock


async def usage_of(http: httpx.AsyncClient, name: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    report = await http.get("/v1/admin/usage", headers=OPS if headers is None else headers)
    assert report.status_code == 200, report.text
    return next(row for row in report.json()["data"] if row["key"] == name)


async def metric(http: httpx.AsyncClient, line_start: str) -> float:
    text = (await http.get("/metrics")).text
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])


async def test_a_key_over_its_requests_limit_gets_429_while_another_is_served() -> None:
    cli, keys = keyed([CHAT_MODEL], key("limited", "LIMITED", requests_per_minute=2), key("other", "OTHER"))
    chat: dict[str, Any] = {"model": CHAT_MODEL, "messages": ASK, "max_tokens": 4, **GREEDY}
    async with serving(cli, keys=keys) as (app, http):
        clock = frozen(app)
        limited, other = sdk(http, "sk-limited"), sdk(http, "sk-other")
        for remaining, reset in (("1", "30s"), ("0", "1m0s")):
            raw = await limited.chat.completions.with_raw_response.create(**chat)
            assert raw.http_response.status_code == 200
            assert [raw.headers.get(name) for name in OPENAI_HEADERS] == ["2", remaining, reset, None, None, None]
        with pytest.raises(openai.RateLimitError) as refused:
            await limited.chat.completions.create(**chat)
        assert refused.value.body == {
            "message": "Rate limit reached for requests per min (RPM) on key 'limited': Limit 2, Used 2, "
            "Requested 1. Please try again in 30s.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        headers = refused.value.response.headers
        assert (headers["retry-after"], headers["x-ratelimit-remaining-requests"]) == ("30", "0")
        assert headers["x-ratelimit-reset-requests"] == "1m0s" and "x-ratelimit-limit-tokens" not in headers

        anthropic = await http.post(
            "/v1/messages", json={"model": CHAT_MODEL, "max_tokens": 4, "messages": ASK}, headers=LIMITED_KEY_HEADERS
        )
        assert anthropic.status_code == 429 and anthropic.headers["retry-after"] == "30"
        assert anthropic.json()["type"] == "error" and anthropic.json()["error"] == {
            "type": "rate_limit_error",
            "message": refused.value.body["message"],
        }

        served = await other.chat.completions.with_raw_response.create(**chat)  # unlimited: no headers at all
        assert served.http_response.status_code == 200 and not any(name in served.headers for name in OPENAI_HEADERS)

        clock.advance(29.9)
        with pytest.raises(openai.RateLimitError, match="Please try again in 100ms"):
            await limited.chat.completions.create(**chat)
        clock.advance(0.1)
        again = await limited.chat.completions.with_raw_response.create(**chat)
        assert again.http_response.status_code == 200 and again.headers["x-ratelimit-remaining-requests"] == "0"

        row = await usage_of(http, "limited")
        assert (row["requests"], row["rate_limited"]) == (3, 3)
        assert row["limits"] == {"requests_per_minute": 2, "tokens_per_minute": None}
        assert row["remaining"] == {"requests": 0, "tokens": None}
        assert (await usage_of(http, "other"))["requests"] == 1
        assert await metric(http, 'modelpool_rate_limited_total{key="limited",limit="requests"}') == 3
        assert await metric(http, 'modelpool_key_requests_total{key="limited"}') == 3
        forbidden = await http.get("/v1/admin/usage", headers=LIMITED_KEY_HEADERS)
        assert forbidden.status_code == 403


async def test_tokens_are_charged_as_used_and_a_spent_budget_refuses() -> None:
    cli, keys = keyed(
        [CHAT_MODEL, EMBED_MODEL],
        key("big", "BIG", tokens_per_minute=10_000),
        key("small", "SMALL", tokens_per_minute=10),
    )
    chat: dict[str, Any] = {"model": CHAT_MODEL, "messages": ASK, "max_tokens": 12, **GREEDY}
    async with serving(cli, keys=keys) as (app, http):
        clock = frozen(app)
        big = sdk(http, "sk-big")
        whole = await big.chat.completions.with_raw_response.create(**chat)
        first = whole.parse().usage
        assert first is not None and first.total_tokens > 10
        spent = first.total_tokens  # charged before the reply's headers went out: they count it
        assert _token_headers(whole.headers) == ("10000", str(10_000 - spent), duration_text(spent * 60 / 10_000))

        streamed = await big.chat.completions.with_raw_response.create(
            **chat, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in streamed.parse()]
        second = chunks[-1].usage
        assert second is not None and second.total_tokens > 10
        # Sent as it started: its prompt was counted by then (at admission), its output was not.
        assert _token_headers(streamed.headers)[1] == str(10_000 - spent - second.prompt_tokens)
        spent += second.total_tokens

        embedded = await big.embeddings.with_raw_response.create(model=EMBED_MODEL, input=["red", "green and blue"])
        third = embedded.parse().usage
        assert third.prompt_tokens > 0
        spent += third.total_tokens
        assert _token_headers(embedded.headers)[1] == str(10_000 - spent)

        completed = await big.completions.with_raw_response.create(
            model=CHAT_MODEL, prompt="Red, green and", max_tokens=6, **GREEDY
        )
        fourth = completed.parse().usage
        assert fourth is not None and fourth.completion_tokens > 0
        spent += fourth.total_tokens
        assert _token_headers(completed.headers)[1] == str(10_000 - spent)

        anthropic = {"model": CHAT_MODEL, "max_tokens": 6, "messages": ASK, "temperature": 0}
        message = await http.post("/v1/messages", json=anthropic, headers={"x-api-key": "sk-big"})
        fifth = message.json()["usage"]
        spent += fifth["input_tokens"] + fifth["output_tokens"]
        assert _token_headers(message.headers)[1] == str(10_000 - spent)

        row = await usage_of(http, "big")
        assert row["requests"] == 5 and row["rate_limited"] == 0
        prompts = (first.prompt_tokens, second.prompt_tokens, third.prompt_tokens, fourth.prompt_tokens)
        assert row["input_tokens"] == sum(prompts) + fifth["input_tokens"]
        outputs = (first.completion_tokens, second.completion_tokens, fourth.completion_tokens)
        assert row["output_tokens"] == sum(outputs) + fifth["output_tokens"]
        assert row["remaining"] == {"requests": None, "tokens": 10_000 - spent}
        assert await metric(http, 'modelpool_key_input_tokens_total{key="big"}') == row["input_tokens"]
        assert await metric(http, 'modelpool_key_output_tokens_total{key="big"}') == row["output_tokens"]

        small = sdk(http, "sk-small")
        overdraw = await small.chat.completions.with_raw_response.create(**chat)  # 10 left: let in, uses more
        used = overdraw.parse().usage
        assert used is not None and used.total_tokens > 10
        assert _token_headers(overdraw.headers)[1] == "0"
        with pytest.raises(openai.RateLimitError) as refused:
            await small.embeddings.create(model=EMBED_MODEL, input="one more")
        level = max(10 - used.total_tokens, -10)  # the debt stops at one minute's budget
        wait_s = (1 - level) * 60 / 10  # until one token is back
        assert refused.value.response.headers["retry-after"] == str(math.ceil(wait_s))
        assert refused.value.body == {
            "message": f"Rate limit reached for tokens per min (TPM) on key 'small': Limit 10, Used "
            f"{10 - level}. Please try again in {duration_text(wait_s)}.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        clock.advance(wait_s)
        assert (await small.embeddings.create(model=EMBED_MODEL, input="one more")).data
        assert await metric(http, 'modelpool_rate_limited_total{key="small",limit="tokens"}') == 1


def _token_headers(headers: Mapping[str, str]) -> tuple[str | None, ...]:
    return tuple(headers.get(f"x-ratelimit-{what}-tokens") for what in ("limit", "remaining", "reset"))


async def test_audio_seconds_are_booked_to_the_key_both_ways() -> None:
    cli, keys = keyed([STT_MODEL, TTS_MODEL], key("voice", "BIG"))
    async with serving(cli, keys=keys) as (_, http):
        voice = sdk(http, "sk-big")
        spoken = await voice.audio.speech.create(
            model=TTS_MODEL, voice="alloy", input="Seven lazy dogs slept.", response_format="wav",
            extra_body={"deterministic": True},
        )  # fmt: skip
        with wave.open(io.BytesIO(spoken.content)) as reader:  # streamed: the header's length is a placeholder
            spoken_s = (len(spoken.content) - 44) / reader.getsampwidth() / reader.getframerate()
        heard = await voice.audio.transcriptions.create(
            model=STT_MODEL, file=("speech.wav", spoken.content), response_format="verbose_json"
        )
        row = await usage_of(http, "voice")
        assert row["requests"] == 2 and spoken_s > 0.5
        assert row["audio_seconds_out"] == pytest.approx(spoken_s, abs=1e-6)
        assert row["audio_seconds_in"] == pytest.approx(heard.duration, abs=1e-3)
        assert row["input_tokens"] == row["output_tokens"] == 0
        out = await metric(http, 'modelpool_key_audio_seconds_total{direction="out",key="voice"}')
        assert out == pytest.approx(spoken_s, abs=1e-6)


async def test_a_realtime_socket_is_limited_at_its_handshake() -> None:
    cli, keys = keyed([STT_MODEL], key("live", "BIG", requests_per_minute=1))
    app = create_app(load_config(None, cli=cli, environ={}), keys=keys)
    async with live_server(app) as base:
        frozen(app)
        url = base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
        async with connect(url, additional_headers={"Authorization": "Bearer sk-big"}) as ws:
            assert ws.response is not None
            assert ws.response.headers["x-ratelimit-remaining-requests"] == "0"
            assert json.loads(await ws.recv())["type"] == "transcription_session.created"
        with pytest.raises(InvalidStatus) as refused:
            await connect(url, additional_headers={"Authorization": "Bearer sk-big"})
        assert refused.value.response.status_code == 429
        assert refused.value.response.headers["retry-after"] == "60"
        assert json.loads(refused.value.response.body)["error"]["code"] == "rate_limit_exceeded"


async def test_unauthenticated_use_has_a_budget_per_client_address() -> None:
    cli = {"enabled_models": [CHAT_MODEL], "auth": {"unauthenticated": {"requests_per_minute": 1}}}
    chat = {"model": CHAT_MODEL, "messages": ASK, "max_tokens": 4, **GREEDY}
    async with serving(cli) as (app, http):
        frozen(app)
        first = await http.post("/v1/chat/completions", json=chat)
        assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "0"
        refused = await http.post("/v1/chat/completions", json=chat)
        assert refused.status_code == 429 and "on client 127.0.0.1" in refused.json()["error"]["message"]
        async with _from_address(app, "10.0.0.2") as elsewhere:
            served = await elsewhere.post("/v1/chat/completions", json=chat)
            assert served.status_code == 200, served.text
        row = await usage_of(http, "anonymous", headers={})
        assert (row["requests"], row["rate_limited"]) == (2, 1)
        assert row["limits"] == {"requests_per_minute": 1, "tokens_per_minute": None} and row["remaining"] is None
        for kind in ("prompt_tokens", "completion_tokens"):
            spent = first.json()["usage"][kind] + served.json()["usage"][kind]
            assert row[kind.replace("prompt", "input").replace("completion", "output")] == spent


def _from_address(app: FastAPI, host: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(host, 4321))
    return httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=120)


async def test_mcp_tool_calls_are_booked_to_the_key(tmp_path: Path) -> None:
    cli, keys = keyed([CHAT_MODEL], key("agent", "BIG", tokens_per_minute=10_000))
    cli["server"] = {"transcript_dir": str(tmp_path)}
    app = create_app(load_config(None, cli=cli, environ={}), keys=keys)
    async with live_server(app) as base:
        frozen(app)
        async with mcp_client(base, "sk-big") as client:
            reply = await call(client, "chat", model=CHAT_MODEL, messages=ASK, max_tokens=5, temperature=0)
        async with httpx.AsyncClient(base_url=base) as http:
            row = await usage_of(http, "agent")
    used = reply["usage"]
    assert (row["input_tokens"], row["output_tokens"]) == (used["prompt_tokens"], used["completion_tokens"])
    assert row["remaining"]["tokens"] == 10_000 - used["prompt_tokens"] - used["completion_tokens"]


STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
ENDLESS = {"model": CHAT_MODEL, "messages": STORY, "max_tokens": 2000, "ignore_eos": True, "stream": True}
"""A stream that would run for seconds: only its client leaving ends it early."""


def _content(line: str) -> bool:
    return line.startswith("data: ") and '"content":"' in line and '"content":""' not in line


async def test_a_stream_its_client_hangs_up_on_is_charged_what_it_used() -> None:
    cli, keys = keyed([CHAT_MODEL], key("cut", "BIG", tokens_per_minute=100_000), key("other", "OTHER"))
    app = create_app(load_config(None, cli=cli, environ={}), keys=keys)
    async with live_server(app) as base, httpx.AsyncClient(base_url=base, timeout=120) as http:
        frozen(app)
        await app.state.pool.slot(CHAT_MODEL).ensure_ready(None)
        async with http.stream("POST", "/v1/chat/completions", json=ENDLESS, headers={"x-api-key": "sk-big"}) as reply:
            assert reply.status_code == 200
            pieces = 0
            async for line in reply.aiter_lines():
                pieces += _content(line)
                if pieces == 3:
                    break  # hang up midway

        async def booked() -> bool:
            return (await usage_of(http, "cut"))["requests"] == 1  # the ledger books a request as it ends

        await until_answered(booked, "the cut-off stream to end", timeout_s=30)
        row = await usage_of(http, "cut")
        whole = {"model": CHAT_MODEL, "messages": STORY, "max_tokens": 1}
        counted = await http.post("/v1/chat/completions", json=whole, headers={"x-api-key": "sk-other"})
        prompt_tokens = counted.json()["usage"]["prompt_tokens"]
        output_metric = await metric(http, 'modelpool_key_output_tokens_total{key="cut"}')
    assert row["input_tokens"] == prompt_tokens > 0
    assert 3 <= row["output_tokens"] < 2000, "the tokens it generated before it stopped"
    assert row["remaining"]["tokens"] == 100_000 - row["input_tokens"] - row["output_tokens"]
    assert output_metric == row["output_tokens"]


async def test_a_stream_in_flight_spends_the_budget_a_new_request_sees() -> None:
    cli, keys = keyed([CHAT_MODEL], key("busy", "BIG", tokens_per_minute=60))
    app = create_app(load_config(None, cli=cli, environ={}), keys=keys)
    chat = {"model": CHAT_MODEL, "messages": ASK, "max_tokens": 4, **GREEDY}
    async with live_server(app) as base, httpx.AsyncClient(base_url=base, timeout=120) as http:
        frozen(app)
        await app.state.pool.slot(CHAT_MODEL).ensure_ready(None)
        async with http.stream("POST", "/v1/chat/completions", json=ENDLESS, headers={"x-api-key": "sk-big"}) as reply:
            assert reply.status_code == 200 and int(reply.headers["x-ratelimit-remaining-tokens"]) < 60  # its prompt
            pieces = 0
            async for line in reply.aiter_lines():
                pieces += _content(line)
                if pieces == 60:
                    break  # 60 pieces (a token or more each) and the prompt: over the budget
            refused = await http.post("/v1/chat/completions", json=chat, headers={"x-api-key": "sk-big"})
            assert refused.status_code == 429, "the stream's tokens so far are charged as they are sent"
            assert refused.json()["error"]["type"] == "tokens"
            assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
            assert int(refused.headers["retry-after"]) <= 61, "a debt of one minute's budget at most"


async def test_loglikelihood_tokens_are_charged_to_the_key() -> None:
    cli, keys = keyed([CHAT_MODEL], key("eval", "BIG", tokens_per_minute=10_000))
    body = {"model": CHAT_MODEL, "prompts": ["The capital of France is", "1, 2, 3,"], "continuations": [" Paris", " 4"]}
    async with serving(cli, keys=keys) as (app, http):
        frozen(app)
        scored = await http.post("/loglikelihood", json=body, headers={"x-api-key": "sk-big"})
        assert scored.status_code == 200, scored.text
        tokens = scored.json()["usage"]["prompt_tokens"]
        assert tokens > 0
        assert scored.headers["x-ratelimit-remaining-tokens"] == str(10_000 - tokens)
        row = await usage_of(http, "eval")
        assert (row["requests"], row["input_tokens"], row["output_tokens"]) == (1, tokens, 0)
        assert row["remaining"]["tokens"] == 10_000 - tokens
