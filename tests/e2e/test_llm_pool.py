"""llm-pool's `/v1/responses` contract, read side by side with its documentation and tests
(github.com/Bobcat/llm-pool: README.md "Inference Example" and "Timing Metrics";
tests/test_api.py; tests/test_multimodal.py), on SmolLM2 through the session's app: its
documented request bodies sent as written (the model id aside), its documented fields read
back — with httpx as its clients do, and with the official `openai` SDK, whose parsing the
extra fields must not break. The flat image input is in tests/e2e/test_vision.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from modelpool.wire.common import MAX_CONTENT_PARTS
from tests.conftest import CHAT_MODEL

ENGINE_NAMES = [  # every timing name llm-pool's clients read (its README's example and its replay client)
    "engine_queue_wait_ms", "engine_tokenize_ms", "gpu_time_to_first_token_ms", "gpu_generate_total_ms",
    "gpu_decode_after_first_token_ms", "engine_total_wall_ms", "engine_outside_backend_wall_ms",
    "pool_total_wall_ms", "backend_inference_wall_ms", "engine_prompt_tokens", "engine_output_tokens",
    "engine_tokens_per_second",
]  # fmt: skip

# llm-pool README.md, "Inference Example": the request as documented (its model id is a GGUF of theirs).
README_REQUEST: dict[str, Any] = {
    "model": "google_gemma-4-26B-A4B-it-Q4_K_M-gguf",
    "input": "The weather is pleasant today, and I would like to take a walk in the park after lunch.",
    "instructions": "Translate to Dutch. Return only the translation.",
    "stream": False,
    "decoding": {
        "beam_size": 1,
        "top_k": 1,
        "top_p": 1.0,
        "temperature": 0.1,
        "repetition_penalty": 1.0,
        "max_tokens": 256,
    },
}

# llm-pool tests/test_api.py, test_streaming_mode_returns_sse_events: the streamed request.
STREAM_REQUEST: dict[str, Any] = {
    "model": "test-model",
    "input": "Hello world",
    "stream": True,
    "decoding": {
        "beam_size": 1,
        "top_k": 5,
        "top_p": 0.9,
        "temperature": 0.3,
        "repetition_penalty": 1.0,
        "max_tokens": 128,
        "stop": ["<|im_end|>"],
    },
}


def ours(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**body, "model": CHAT_MODEL, **changes}


def check_engine_metrics(metrics: dict[str, Any], usage: dict[str, Any]) -> None:
    """Each name holds the measurement docs/compatibility.md says it does."""
    assert set(ENGINE_NAMES) <= set(metrics)
    backend = metrics["backend_inference_wall_ms"]
    assert backend == metrics["backend_ms"] and backend > 0
    assert metrics["engine_queue_wait_ms"] == metrics["queue_wait_ms"]
    total = metrics["engine_total_wall_ms"]
    assert total == pytest.approx(metrics["load_wait_ms"] + metrics["queue_wait_ms"] + backend, abs=0.01)
    assert metrics["engine_outside_backend_wall_ms"] == pytest.approx(total - backend, abs=0.01)
    assert metrics["pool_total_wall_ms"] == metrics["server_ms"] and metrics["pool_total_wall_ms"] >= total
    tokenize = metrics["engine_tokenize_ms"]  # measured by the in-process engines (SmolLM2 runs on llama.cpp)
    assert tokenize is not None and 0 < tokenize < backend
    first = metrics["gpu_time_to_first_token_ms"]
    assert first is not None and 0 < first <= backend
    assert first == pytest.approx(metrics["time_to_first_token_ms"] - tokenize, abs=0.01)
    after_first = backend - metrics["time_to_first_token_ms"]
    assert metrics["gpu_decode_after_first_token_ms"] == pytest.approx(after_first, abs=0.01)
    assert metrics["gpu_generate_total_ms"] == pytest.approx(backend - tokenize, abs=0.01)
    assert metrics["engine_prompt_tokens"] == usage["input_tokens"]
    assert metrics["engine_output_tokens"] == usage["output_tokens"] > 0
    assert metrics["engine_tokens_per_second"] == pytest.approx(usage["output_tokens"] / backend * 1000, rel=0.01)


async def test_the_readme_request_gets_the_readme_response_fields(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/responses", json=ours(README_REQUEST, decoding={**README_REQUEST["decoding"],
                                                                                   "max_tokens": 16}))  # fmt: skip
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["object"] == "response" and payload["model"] == CHAT_MODEL  # as llm-pool's test reads them
    assert payload["output_text"] and payload["output_text"] == payload["output"][0]["content"][0]["text"]
    check_engine_metrics(payload["metrics"], payload["usage"])


async def test_the_stream_sends_response_metrics_right_before_completed(http: httpx.AsyncClient) -> None:
    async with http.stream("POST", "/v1/responses", json=ours(STREAM_REQUEST)) as response:
        text = (await response.aread()).decode()
    # Read as llm-pool's test reads it: events split on blank lines, the metrics second to last.
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream; charset=utf-8"
    for name in ("response.created", "response.output_text.delta", "response.metrics"):
        assert f"event: {name}" in text
    # sampled (temperature 0.3): it may run to max_tokens, which OpenAI's API calls incomplete (docs say so)
    assert "event: response.completed" in text or "event: response.incomplete" in text
    events = [item for item in text.strip().split("\n\n") if item.strip()]
    metrics_payload = json.loads(events[-2].split("data: ", 1)[1])
    assert metrics_payload["type"] == "response.metrics"
    completed_payload = json.loads(events[-1].split("data: ", 1)[1])
    assert completed_payload["type"] in ("response.completed", "response.incomplete")
    deltas = [json.loads(e.split("data: ", 1)[1])["delta"] for e in events if "output_text.delta" in e]
    assert completed_payload["output_text"] == "".join(deltas) == completed_payload["response"]["output_text"]
    assert metrics_payload["metrics"] == completed_payload["response"]["metrics"]  # also kept where it was
    check_engine_metrics(metrics_payload["metrics"], completed_payload["response"]["usage"])


async def test_the_openai_sdk_parses_the_extra_fields(oai: openai.AsyncOpenAI) -> None:
    raw = await oai.responses.with_raw_response.create(model=CHAT_MODEL, input="Name a color.", max_output_tokens=8)
    reply = raw.parse()
    assert reply.output_text == json.loads(raw.text)["output_text"]  # the SDK's property and the JSON agree
    stream = await oai.responses.create(model=CHAT_MODEL, input="Name a color.", max_output_tokens=8, stream=True)
    events = [event async for event in stream]
    assert events[-2].type == "response.metrics"
    assert events[-2].model_extra is not None and "engine_total_wall_ms" in events[-2].model_extra["metrics"]
    assert events[-1].type in ("response.completed", "response.incomplete")  # 8 tokens may cut it short
    assert events[-1].response.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")


FLAT_TEXT = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]  # llm-pool tests/test_multimodal.py


async def test_a_flat_text_array_is_one_user_message(http: httpx.AsyncClient) -> None:
    greedy = {"temperature": 0, "max_tokens": 6}
    flat = await http.post("/v1/responses", json={"model": CHAT_MODEL, "input": FLAT_TEXT, "decoding": greedy})
    plain = await http.post("/v1/responses", json={"model": CHAT_MODEL, "input": "Hello world", "decoding": greedy})
    assert flat.status_code == 200, flat.text
    assert flat.json()["usage"]["input_tokens"] == plain.json()["usage"]["input_tokens"]
    assert flat.json()["output_text"] == plain.json()["output_text"]


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
MESSAGE = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("flat", "status", "param", "words"),
    [
        ([FLAT_TEXT[0], MESSAGE], 400, "input", "input[1] is an input item but input[0] is a content part"),
        ([MESSAGE, MESSAGE, FLAT_TEXT[0]], 400, "input", "input[2] is a content part but input[0] is an input item"),
        ([FLAT_TEXT[0]] * (MAX_CONTENT_PARTS + 1), 400, "input", f"at most {MAX_CONTENT_PARTS} items"),
        ([FLAT_TEXT[0], {"type": "image_url", "image_url": {}}], 400, "input[1].image_url.url", "required"),
        ([FLAT_TEXT[0], {"type": "text"}], 400, "input[1].text", "required"),
        ([FLAT_TEXT[0], {"type": "input_audio", "input_audio": {}}], 400, "input", None),
        ([FLAT_TEXT[0], IMAGE], 400, "input[1]", "image"),  # SmolLM2 reads no images
    ],
    ids=["part-then-item", "items-then-part", "too-many-parts", "image-without-url", "text-without-text",
         "audio-part", "image-on-a-text-model"],
)
async def test_bad_flat_arrays_get_a_clear_400(
    http: httpx.AsyncClient, flat: list[Any], status: int, param: str, words: str | None
) -> None:
    response = await http.post("/v1/responses", json={"model": CHAT_MODEL, "input": flat})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param)
    assert words is None or words in error["message"]
