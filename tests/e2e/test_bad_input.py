"""A table of bad requests: each gets a 4xx in the OpenAI envelope naming the offending
param, never a 500 or a hang, and the server keeps serving afterwards."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import CHAT_MODEL, EMBED_MODEL

OK_MESSAGES = [{"role": "user", "content": "hi"}]
TEXT_PART = {"type": "text", "text": "what is it?"}
DEEP_SCHEMA: dict[str, object] = {"type": "object"}
for _ in range(400):
    DEEP_SCHEMA = {"items": DEEP_SCHEMA}
PNG = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def chat(**fields: object) -> dict[str, object]:
    return {"model": CHAT_MODEL, "messages": OK_MESSAGES, **fields}


# (id, method, path, body (dict → JSON; str/bytes sent raw), status, code, param)
Body = dict[str, Any] | str | bytes | None
CASES: list[tuple[str, str, str, Body, int, str, str | None]] = [
    ("invalid-json", "POST", CHAT, '{"model": "x", "messages": [', 400, "invalid_value", None),
    ("body-not-object", "POST", CHAT, "[1, 2]", 400, "invalid_value", None),
    ("empty-body", "POST", CHAT, "", 400, "invalid_value", None),
    ("missing-model", "POST", CHAT, {"messages": OK_MESSAGES}, 400, "invalid_value", "model"),
    ("model-wrong-type", "POST", CHAT, chat(model=42), 400, "invalid_value", "model"),
    ("messages-wrong-type", "POST", CHAT, chat(messages="hi"), 400, "invalid_value", "messages"),
    ("messages-empty", "POST", CHAT, chat(messages=[]), 400, "invalid_value", "messages"),
    (
        "unknown-role",
        "POST",
        CHAT,
        chat(messages=[{"role": "robot", "content": "x"}]),
        400,
        "invalid_value",
        "messages[0].role",
    ),
    (
        "empty-user-content",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": ""}]),
        400,
        "invalid_value",
        "messages[0].content",
    ),
    (
        "image-to-a-text-model",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": [TEXT_PART, {"type": "image_url", "image_url": {"url": PNG}}]}]),
        400,
        "modality_unsupported",
        "messages[0].content[1]",
    ),
    (
        "audio-part",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]),  # noqa: E501
        400,
        "modality_unsupported",
        "messages[0].content[0]",
    ),
    (
        "image-in-a-system-message",
        "POST",
        CHAT,
        chat(messages=[{"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}, *OK_MESSAGES]),  # noqa: E501
        400,
        "invalid_value",
        "messages[0].content[0]",
    ),
    ("unknown-field", "POST", CHAT, chat(frobnicate=True), 400, "invalid_value", "frobnicate"),
    ("n-two", "POST", CHAT, chat(n=2), 400, "invalid_value", "n"),
    ("temperature-negative", "POST", CHAT, chat(temperature=-0.5), 400, "invalid_value", "temperature"),
    ("temperature-huge", "POST", CHAT, chat(temperature=9), 400, "invalid_value", "temperature"),
    ("top-p-over-one", "POST", CHAT, chat(top_p=1.5), 400, "invalid_value", "top_p"),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), 400, "invalid_value", "max_tokens"),
    ("max-tokens-string", "POST", CHAT, chat(max_tokens="many"), 400, "invalid_value", "max_tokens"),
    ("top-logprobs-alone", "POST", CHAT, chat(top_logprobs=2), 400, "invalid_value", None),
    ("top-logprobs-too-many", "POST", CHAT, chat(logprobs=True, top_logprobs=50), 400, "invalid_value", "top_logprobs"),
    ("too-many-stops", "POST", CHAT, chat(stop=[f"s{i}" for i in range(20)]), 400, "invalid_value", "stop"),
    ("min-tokens-negative", "POST", CHAT, chat(min_tokens=-1), 400, "invalid_value", "min_tokens"),
    ("min-tokens-over-max", "POST", CHAT, chat(max_tokens=4, min_tokens=5), 400, "invalid_value", "min_tokens"),
    ("ignore-eos-as-string", "POST", CHAT, chat(ignore_eos="yes"), 400, "invalid_value", "ignore_eos"),
    (
        "min-tokens-over-completion-default",  # /v1/completions caps at 16 tokens unless told
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": "a", "min_tokens": 17},
        400,
        "invalid_value",
        "min_tokens",
    ),
    (
        "decoding-min-tokens-over-max",
        "POST",
        "/v1/responses",
        {"model": CHAT_MODEL, "input": "hi", "decoding": {"max_tokens": 2, "min_tokens": 3}},
        400,
        "invalid_value",
        "decoding.min_tokens",
    ),
    ("tool-not-a-function", "POST", CHAT, chat(tools=[{"type": "web_search"}]), 400, "invalid_value", "tools[0].type"),
    (
        "tool-bad-name",
        "POST",
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "no spaces"}}]),
        400,
        "invalid_value",
        "tools[0].function.name",
    ),
    (
        "tool-parameters-not-a-schema",
        "POST",
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]),
        400,
        "invalid_value",
        "tools[0].function.parameters",
    ),
    (
        "tool-choice-unknown-function",
        "POST",
        CHAT,
        chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}),
        400,
        "invalid_value",
        "tool_choice",
    ),
    ("tool-choice-required-without-tools", "POST", CHAT, chat(tool_choice="required"), 400, "invalid_value",
     "tool_choice"),
    (
        "tool-message-without-call",
        "POST",
        CHAT,
        chat(messages=[*OK_MESSAGES, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]),
        400,
        "invalid_value",
        "messages[1].tool_call_id",
    ),
    (
        "response-format-bad-schema",
        "POST",
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"minimum": "0"}}}),
        400,
        "invalid_value",
        "response_format.json_schema.schema",
    ),
    (
        "response-format-schema-with-a-bad-$schema",
        "POST",
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$schema": 5}}}),
        400,
        "invalid_value",
        "response_format.json_schema.schema",
    ),
    (
        "tool-parameters-nested-too-deep",
        "POST",
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": DEEP_SCHEMA}}]),
        413,  # past server.max_schema_depth: refused by the cap before the schema is checked
        "request_too_large",
        "tools[0].function.parameters",
    ),
    (
        "response-format-unenforceable-schema",
        "POST",
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "null"}}}}),  # noqa: E501
        400,
        "invalid_value",
        "response_format",
    ),
    (
        "response-format-unknown-type",
        "POST",
        CHAT,
        chat(response_format={"type": "yaml"}),
        400,
        "invalid_value",
        "response_format",
    ),
    (
        "generate-bad-schema",
        "POST",
        "/generate",
        {"model": CHAT_MODEL, "prompts": ["a"], "json_schema": {"type": 5}},
        400,
        "invalid_value",
        "json_schema",
    ),
    ("logit-bias", "POST", CHAT, chat(logit_bias={"1": 5}), 400, "invalid_value", "logit_bias"),
    ("unknown-model", "POST", CHAT, chat(model="no-such-model"), 404, "model_not_found", "model"),
    ("embedder-for-chat", "POST", CHAT, chat(model=EMBED_MODEL), 400, "unsupported_task", "model"),
    ("max-tokens-past-context", "POST", CHAT, chat(max_tokens=100_000), 400, "context_length_exceeded", "max_tokens"),
    (
        "prompt-longer-than-context",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": "hello " * 5000, "max_tokens": 1},
        400,
        "context_length_exceeded",
        "prompt",
    ),
    (
        "messages-longer-than-context",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": "hello " * 5000}]),
        400,
        "context_length_exceeded",
        "messages",
    ),
    ("completion-empty-list", "POST", COMPLETIONS, {"model": CHAT_MODEL, "prompt": []}, 400, "invalid_value", "prompt"),
    (
        "completion-suffix",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": "a", "suffix": "b"},
        400,
        "invalid_value",
        "suffix",
    ),
    (
        "completion-best-of",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": "a", "best_of": 3},
        400,
        "invalid_value",
        "best_of",
    ),
    # Beam search: bounds, sampling beside it, and an engine without it (llama.cpp) name the field.
    ("beam-on-llama-cpp", "POST", CHAT, chat(beam_size=4, temperature=0), 400, "invalid_value", "beam_size"),
    ("completion-beam-on-llama-cpp", "POST", COMPLETIONS, {"model": CHAT_MODEL, "prompt": "a", "beam_size": 2},
     400, "invalid_value", "beam_size"),
    ("beam-size-zero", "POST", CHAT, chat(beam_size=0), 400, "invalid_value", "beam_size"),
    ("beam-size-negative", "POST", CHAT, chat(beam_size=-1), 400, "invalid_value", "beam_size"),
    ("beam-size-huge", "POST", CHAT, chat(beam_size=10**12), 400, "invalid_value", "beam_size"),
    ("beam-size-over-the-cap", "POST", CHAT, chat(beam_size=65), 400, "invalid_value", "beam_size"),
    ("beam-with-sampling", "POST", CHAT, chat(beam_size=4, temperature=0.8), 400, "invalid_value", "temperature"),
    ("beam-with-top-p", "POST", CHAT, chat(beam_size=4, top_p=0.5), 400, "invalid_value", "top_p"),
    ("beam-with-min-p", "POST", CHAT, chat(beam_size=4, min_p=0.2), 400, "invalid_value", "min_p"),
    ("length-penalty-without-beam", "POST", CHAT, chat(length_penalty=2.0), 400, "invalid_value", "length_penalty"),
    ("length-penalty-huge", "POST", CHAT, chat(beam_size=2, length_penalty=1e9), 400, "invalid_value",
     "length_penalty"),
    ("beam-with-n", "POST", CHAT, chat(beam_size=2, n=3), 400, "invalid_value", "n"),
    (
        "completion-bad-token-id",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": [1, 99_999_999]},
        400,
        "invalid_value",
        "prompt",
    ),
    (
        "completion-logprobs-too-many",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": "a", "logprobs": 99},
        400,
        "invalid_value",
        "logprobs",
    ),
    ("embeddings-empty-string", "POST", EMBEDDINGS, {"model": EMBED_MODEL, "input": ""}, 400, "invalid_value", "input"),
    ("embeddings-empty-list", "POST", EMBEDDINGS, {"model": EMBED_MODEL, "input": []}, 400, "invalid_value", "input"),
    (
        "embeddings-bad-format",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": "a", "encoding_format": "hex"},
        400,
        "invalid_value",
        "encoding_format",
    ),
    (
        "embeddings-token-out-of-vocab",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": [[5, 10_000_000]]},
        400,
        "invalid_value",
        "input[0]",
    ),
    (
        "embeddings-dimensions",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": "a", "dimensions": 385},  # one more than MiniLM makes
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "embeddings-dimensions-huge",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": "a", "dimensions": 10**12},
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "embeddings-dimensions-zero",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": "a", "dimensions": 0},
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "embeddings-dimensions-type",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": "a", "dimensions": "64"},
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "chat-model-for-embeddings",
        "POST",
        EMBEDDINGS,
        {"model": CHAT_MODEL, "input": "a"},
        400,
        "unsupported_task",
        "model",
    ),
    (
        "body-too-large",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": "x" * 2_000_000}]),
        413,
        "request_too_large",
        None,
    ),
    (
        "lone-surrogate-content",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": "\ud800"}]),
        400,
        "invalid_value",
        "messages[0].content",
    ),
    (
        "lone-surrogate-prompt",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt": "a\ud800"},
        400,
        "invalid_value",
        "prompt",
    ),
    (
        "lone-surrogate-input",
        "POST",
        EMBEDDINGS,
        {"model": EMBED_MODEL, "input": ["ok", "\udfff"]},
        400,
        "invalid_value",
        "input[1]",
    ),
    ("stream-as-string", "POST", CHAT, chat(stream="true"), 400, "invalid_value", "stream"),
    (
        "booleans-as-token-ids",
        "POST",
        COMPLETIONS,
        {"model": CHAT_MODEL, "prompt[0]": [True, False]},
        400,
        "invalid_value",
        "prompt",
    ),
    ("keep-alive-garbage", "POST", CHAT, chat(keep_alive="soon"), 400, "invalid_value", "keep_alive"),
    ("unknown-route", "GET", "/v1/nothing-here", None, 404, "not_found", None),
    ("wrong-method", "GET", CHAT, None, 405, "method_not_allowed", None),
    ("unknown-model-retrieve", "GET", "/v1/models/nope", None, 404, "model_not_found", "model"),
]


async def send(http: httpx.AsyncClient, method: str, path: str, body: Body) -> httpx.Response:
    if body is None:
        return await http.request(method, path)
    # json.dumps escapes non-ASCII (\\ud800 stays an escape, as a client would send it).
    content = json.dumps(body) if isinstance(body, dict) else body
    return await http.request(method, path, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "param"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
async def test_bad_request_gets_a_clear_4xx(
    http: httpx.AsyncClient, method: str, path: str, body: Body, status: int, code: str, param: str | None
) -> None:
    response = await send(http, method, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"] and "Traceback" not in error["message"]


async def test_server_keeps_serving_after_the_whole_table(http: httpx.AsyncClient) -> None:
    for _, method, path, body, *_ in CASES:
        assert (await send(http, method, path, body)).status_code < 500
    chat_ok = await http.post(CHAT, json=chat(max_tokens=4))
    assert chat_ok.status_code == 200 and chat_ok.json()["choices"][0]["message"]["content"]
    embed_ok = await http.post(EMBEDDINGS, json={"model": EMBED_MODEL, "input": "still here"})
    assert embed_ok.status_code == 200


async def test_chunked_body_over_the_limit_is_413(http: httpx.AsyncClient) -> None:
    async def chunks():  # no Content-Length: the server must count as it reads
        for _ in range(30):
            yield json.dumps({"pad": "x" * 50_000}).encode()

    response = await http.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
