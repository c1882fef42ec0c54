"""Our requests in the OpenAI wire format, and upstream answers (streamed or whole) back as
our chunks."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from modelpool.backends.remote import wire
from modelpool.errors import UpstreamError
from modelpool.inference import ChatMessage, ChatRequest, CompletionRequest, SamplingParams, Usage


def test_chat_body_sends_what_is_set_and_engine_extras_only_when_used() -> None:
    plain = wire.chat_body(ChatRequest((ChatMessage("user", "hi"),)), "up")
    assert plain == {
        "model": "up",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 1.0,
        "top_p": 1.0,
    }
    sampling = SamplingParams(
        max_tokens=5, top_k=40, min_p=0.1, repetition_penalty=1.1, seed=7, stop=("x",), logprobs=3
    )
    request = ChatRequest(
        (ChatMessage("user", "hi", name="ann"),), sampling, {"enable_thinking": False}, streamed=False
    )
    body = wire.chat_body(request, "up")
    assert body["stream"] is False and "stream_options" not in body
    assert body["messages"] == [{"role": "user", "content": "hi", "name": "ann"}]
    assert {k: body[k] for k in ("max_tokens", "top_k", "min_p", "repetition_penalty", "seed", "stop")} == {
        "max_tokens": 5, "top_k": 40, "min_p": 0.1, "repetition_penalty": 1.1, "seed": 7, "stop": ["x"],
    }  # fmt: skip
    assert body["logprobs"] is True and body["top_logprobs"] == 3
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_ignore_eos_and_min_tokens_go_upstream_only_when_set() -> None:
    # vLLM and llama-server know both; OpenAI itself rejects them, so unset means absent.
    plain = wire.completion_body(CompletionRequest("hi"), "up")
    assert "ignore_eos" not in plain and "min_tokens" not in plain
    sampling = SamplingParams(max_tokens=9, ignore_eos=True, min_tokens=4)
    for body in (
        wire.completion_body(CompletionRequest("hi", sampling), "up"),
        wire.chat_body(ChatRequest((ChatMessage("user", "hi"),), sampling), "up"),
    ):
        assert (body["ignore_eos"], body["min_tokens"]) == (True, 4)


def test_completion_body_keeps_token_prompts_and_echo() -> None:
    body = wire.completion_body(CompletionRequest((1, 2, 3), SamplingParams(logprobs=1), echo=True), "up")
    assert body["prompt"] == [1, 2, 3] and body["echo"] is True and body["logprobs"] == 1


async def events(*payloads: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    for payload in payloads:
        yield payload


def delta(**fields: object) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


async def test_chat_stream_holds_the_finish_until_the_usage_event() -> None:
    stream = events(
        delta(role="assistant", content=""),
        delta(reasoning_content="think"),
        delta(content="Hel"),
        {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "length",
                      "logprobs": {"content": [{"token": "lo", "logprob": -0.5, "bytes": [108, 111],
                                                "top_logprobs": [{"token": "lo", "logprob": -0.5}]}]}}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}},
    )  # fmt: skip
    chunks = [c async for c in wire.chat_chunks(stream)]
    assert [(c.text, c.reasoning) for c in chunks[:-1]] == [("", "think"), ("Hel", ""), ("lo", "")]
    assert chunks[2].logprobs[0].logprob == -0.5 and chunks[2].logprobs[0].top[0].bytes == (108, 111)
    assert (chunks[-1].finish_reason, chunks[-1].usage) == ("length", Usage(9, 3))


async def test_a_stream_without_usage_counts_its_events_as_completion_tokens() -> None:
    chunks = [
        c async for c in wire.completion_chunks(events({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}))
    ]
    assert "".join(c.text for c in chunks) == "ab" and chunks[-1].usage == Usage(0, 2)
    assert chunks[-1].finish_reason == "stop"


def test_whole_answers_become_an_answer_and_a_finish() -> None:
    payload = {
        "choices": [
            {"message": {"role": "assistant", "content": "Paris", "reasoning": "easy"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    }
    answer, finish = wire.chat_whole(payload)
    assert (answer.text, answer.reasoning, finish.finish_reason, finish.usage) == ("Paris", "easy", "stop", Usage(4, 1))
    logprobs = {"tokens": [" Paris"], "token_logprobs": [-0.2], "top_logprobs": [{" Paris": -0.2, " a": -3.0}]}
    completion = {"choices": [{"text": " Paris", "finish_reason": "length", "logprobs": logprobs}]}
    answer, finish = wire.completion_whole(completion)
    assert answer.logprobs[0].greedy and [t.token for t in answer.logprobs[0].top] == [" Paris", " a"]
    assert finish.usage is None and finish.finish_reason == "length"
    with pytest.raises(UpstreamError, match="without any choice"):
        wire.chat_whole({"choices": []})


def test_embeddings_decode_base64_or_floats_in_input_order() -> None:
    row = np.array([0.5, -1.0], dtype="<f4")
    payload = {
        "data": [
            {"index": 1, "embedding": [1.0, 2.0]},
            {"index": 0, "embedding": base64.b64encode(row.tobytes()).decode()},
        ]
    }
    vectors = wire.embedding_vectors(payload, 2)
    assert vectors.dtype == np.float32 and vectors.tolist() == [[0.5, -1.0], [1.0, 2.0]]
    with pytest.raises(UpstreamError, match="1 embeddings for 2 inputs"):
        wire.embedding_vectors({"data": payload["data"][:1]}, 2)
