"""A table of bad requests to /v1/messages and /v1/messages/count_tokens: each gets its 4xx
in Anthropic's error shape ({"type": "error", "error": {"type", "message"}}) with the field
named in the message, never a 500, while the OpenAI routes keep OpenAI's envelope."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import CHAT_MODEL, EMBED_MODEL

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
HI = [{"role": "user", "content": "hi"}]
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Madrid"}}
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}


def body(**fields: object) -> dict[str, object]:
    return {"model": CHAT_MODEL, "max_tokens": 5, "messages": HI, **fields}


def without(field: str) -> dict[str, object]:
    return {k: v for k, v in body().items() if k != field}


def result_for(tool_use_id: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "30C"}]}]


# (id, path, body (dict → JSON; str sent raw), status, Anthropic error type, a word the message has)
CASES = [
    ("malformed-json", MESSAGES, '{"model": "x", "messages": [', 400, "invalid_request_error", "JSON"),
    ("missing-max-tokens", MESSAGES, without("max_tokens"), 400, "invalid_request_error", "max_tokens"),
    ("zero-max-tokens", MESSAGES, body(max_tokens=0), 400, "invalid_request_error", "max_tokens"),
    ("missing-messages", MESSAGES, without("messages"), 400, "invalid_request_error", "messages"),
    ("empty-messages", MESSAGES, body(messages=[]), 400, "invalid_request_error", "messages"),
    ("system-role", MESSAGES, body(messages=[{"role": "system", "content": "x"}]), 400, "invalid_request_error",
     "messages[0].role"),
    ("empty-user-text", MESSAGES, body(messages=[{"role": "user", "content": ""}]), 400, "invalid_request_error",
     "messages[0].content"),
    ("temperature-over-1", MESSAGES, body(temperature=1.5), 400, "invalid_request_error", "temperature"),
    ("top-p-over-1", MESSAGES, body(top_p=2), 400, "invalid_request_error", "top_p"),
    ("empty-stop-sequence", MESSAGES, body(stop_sequences=[""]), 400, "invalid_request_error", "stop_sequences"),
    ("unknown-field", MESSAGES, body(frequency_penalty=1), 400, "invalid_request_error", "frequency_penalty"),
    ("unknown-block-type", MESSAGES, body(messages=[{"role": "user", "content": [{"type": "document", "x": 1}]}]),
     400, "invalid_request_error", "messages[0].content[0]"),
    ("tool-result-without-tool-use", MESSAGES, body(messages=result_for("toolu_9")), 400, "invalid_request_error",
     "tool_use_id"),
    ("tool-result-for-another-call", MESSAGES,
     body(messages=[*HI, {"role": "assistant", "content": [CALL]}, *result_for("toolu_2")]), 400,
     "invalid_request_error", "toolu_2"),
    ("tool-use-in-a-user-turn", MESSAGES, body(messages=[{"role": "user", "content": [CALL]}]), 400,
     "invalid_request_error", "messages[0].content[0]"),
    ("image-in-an-assistant-turn", MESSAGES, body(messages=[*HI, {"role": "assistant", "content": [IMAGE]}]), 400,
     "invalid_request_error", "messages[1].content[0]"),
    ("assistant-prefill", MESSAGES, body(messages=[*HI, {"role": "assistant", "content": "Sure:"}]), 400,
     "invalid_request_error", "prefill"),
    ("image-to-a-text-model", MESSAGES, body(messages=[{"role": "user", "content": [IMAGE]}]), 400,
     "invalid_request_error", "image"),
    ("bad-media-type", MESSAGES, body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}}]}]), 400,
     "invalid_request_error", "media_type"),
    ("tool-choice-unknown-tool", MESSAGES, body(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), 400,
     "invalid_request_error", "tool_choice"),
    ("tool-choice-any-without-tools", MESSAGES, body(tool_choice={"type": "any"}), 400, "invalid_request_error",
     "tool_choice"),
    ("bad-input-schema", MESSAGES, body(tools=[{"name": "f", "input_schema": {"type": 3}}]), 400,
     "invalid_request_error", "tools[0]"),
    ("bad-thinking-type", MESSAGES, body(thinking={"type": "maybe"}), 400, "invalid_request_error", "thinking"),
    ("unknown-model", MESSAGES, body(model="no-such-model"), 404, "not_found_error", "no-such-model"),
    ("embedding-model", MESSAGES, body(model=EMBED_MODEL), 400, "invalid_request_error", EMBED_MODEL),
    ("body-too-large", MESSAGES, body(messages=[{"role": "user", "content": "x" * 1_100_000}]), 413,
     "request_too_large", "limit"),
    ("prompt-past-the-context", MESSAGES, body(messages=[{"role": "user", "content": "hello " * 9000}]), 400,
     "invalid_request_error", "tokens"),
    ("unknown-subpath", "/v1/messages/batches", body(), 404, "not_found_error", "Unknown route"),
    ("count-missing-messages", COUNT, {"model": CHAT_MODEL}, 400, "invalid_request_error", "messages"),
    ("count-unknown-model", COUNT, {"model": "no-such-model", "messages": HI}, 404, "not_found_error", "no-such"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "payload", "status", "error_type", "word"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
async def test_bad_input_is_answered_in_anthropics_shape(
    http: httpx.AsyncClient, path: str, payload: object, status: int, error_type: str, word: str
) -> None:
    if isinstance(payload, str):
        response = await http.post(path, content=payload, headers={"content-type": "application/json"})
    else:
        response = await http.post(path, json=payload)
    answer = response.json()
    assert (response.status_code, answer["type"], answer["error"]["type"]) == (status, "error", error_type), answer
    assert word in answer["error"]["message"]


async def test_a_wrong_method_and_the_openai_routes_keep_their_shapes(http: httpx.AsyncClient) -> None:
    wrong_method = await http.get(MESSAGES)
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
    openai_shape = await http.post("/v1/chat/completions", json=body(model="no-such-model"))
    assert openai_shape.status_code == 404 and "type" not in openai_shape.json()
    assert openai_shape.json()["error"]["code"] == "model_not_found"
    still_serving = await http.post(MESSAGES, json=body())
    assert still_serving.status_code == 200 and json.loads(still_serving.text)["type"] == "message"
