"""Our requests in the OpenAI wire format, and upstream answers (streamed or whole) back as
our chunks."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from modelpool.errors import UpstreamError
from modelpool.inference import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    ImageInput,
    OutputFormat,
    SamplingParams,
    TextPart,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
    VideoInput,
)
from modelpool.wire.openai import upstream as wire


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


def test_tools_history_and_formats_are_forwarded_as_the_client_sent_them() -> None:
    call = ToolCall("call_1", "add", '{"a": 1}')
    messages = (
        ChatMessage("user", "add one"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "2", tool_call_id="call_1"),
    )
    tool = Tool("add", "Adds.", {"type": "object", "properties": {"a": {"type": "integer"}}})
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}}
    request = ChatRequest(messages, tools=(tool,), tool_choice=ToolChoice("function", "add"), parallel_tool_calls=False,
                          output=OutputFormat("json_schema", schema, "total"))  # fmt: skip
    body = wire.chat_body(request, "up")
    assert body["messages"][1:] == [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "content": "2", "tool_call_id": "call_1"},
    ]  # fmt: skip
    assert body["tools"] == [{"type": "function", "function": {"name": "add", "description": "Adds.",
                                                               "parameters": tool.parameters}}]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "total", "schema": schema, "strict": True}}  # fmt: skip
    plain = wire.chat_body(ChatRequest(messages[:1], tools=(tool,)), "up")
    assert plain["tool_choice"] == "auto" and "parallel_tool_calls" not in plain and "response_format" not in plain
    generate = wire.completion_body(CompletionRequest("x", output=OutputFormat("json_object")), "up")
    assert generate["response_format"] == {"type": "json_object"}


async def test_upstream_tool_calls_come_back_as_pieces_streamed_or_whole() -> None:
    first = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "add", "arguments": ""}}
    stream = events(
        delta(tool_calls=[first]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a":'}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": " 1}"}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6}},
    )
    chunks = [c async for c in wire.chat_chunks(stream)]
    pieces = [p for c in chunks for p in c.tool_calls]
    assert pieces == [ToolCallDelta(0, "call_9", "add", ""), ToolCallDelta(0, None, None, '{"a":'),
                      ToolCallDelta(0, None, None, " 1}")]  # fmt: skip
    assert chunks[-1].finish_reason == "tool_calls" and chunks[-1].usage == Usage(4, 6)
    whole = {
        "choices": [{"message": {"content": None, "tool_calls": [{"id": "call_9", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1}'}}]}, "finish_reason": "tool_calls"}],
    }  # fmt: skip
    answer, finish = wire.chat_whole(whole)
    assert answer.tool_calls == (ToolCallDelta(0, "call_9", "add", '{"a": 1}'),) and answer.text == ""
    assert finish.finish_reason == "tool_calls"


async def test_a_repeated_name_on_later_pieces_is_sent_once() -> None:
    """llama-cpp-python's server names the function on every streamed piece."""
    named = {"index": 0, "id": "call_1", "function": {"name": "add", "arguments": '{"a"'}}
    again = {"index": 0, "id": "call_1", "function": {"name": "add", "arguments": ": 1}"}}
    chunks = [c async for c in wire.chat_chunks(events(delta(tool_calls=[named]), delta(tool_calls=[again])))]
    pieces = [p for c in chunks for p in c.tool_calls]
    assert pieces == [ToolCallDelta(0, "call_1", "add", '{"a"'), ToolCallDelta(0, None, None, ": 1}")]


def test_image_parts_are_forwarded_as_data_uris_or_by_url_in_order() -> None:
    loaded = ImageInput("file:///m/cat.png", "messages[0].content[1]", "low", data_uri="data:image/png;base64,AAA")
    by_url = ImageInput("https://example.com/dog.png", "messages[0].content[2]")  # the upstream fetches it
    message = ChatMessage("user", "compare", parts=(TextPart("compare"), loaded, by_url))
    body = wire.chat_body(ChatRequest((message,)), "up")
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/dog.png"}},
    ]}]  # fmt: skip


def test_video_parts_are_forwarded_as_they_came_and_parsed_from_chat_requests() -> None:
    from modelpool.wire.openai.chat import ChatCompletionBody

    loaded = VideoInput("file:///m/clip.mp4", "messages[0].content[0]", data_uri="data:video/mp4;base64,AAA")
    by_url = VideoInput("https://example.com/clip.webm", "messages[0].content[1]")
    message = ChatMessage("user", "", parts=(loaded, by_url))
    body = wire.chat_body(ChatRequest((message,)), "up")
    assert body["messages"][0]["content"] == [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAA"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/clip.webm"}},
    ]
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA"}}
    content = [{"type": "text", "text": "what happens?"}, video]
    parsed = ChatCompletionBody.model_validate({"model": "m", "messages": [{"role": "user", "content": content}]})
    parts = parsed.messages[0].content
    assert isinstance(parts, list) and parts[1].type == "video_url"


async def test_vllms_stop_reason_names_the_stop_sequence_streamed_or_whole() -> None:
    hit = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop", "stop_reason": "##"}]}
    chunks = [c async for c in wire.chat_chunks(events(hit))]
    assert (chunks[-1].finish_reason, chunks[-1].stop_sequence) == ("stop", "##")
    token_stop = {"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "stop_reason": 2}]}
    assert wire.chat_whole(token_stop)[-1].stop_sequence is None  # a stop token is not a stop sequence
    whole = {"choices": [{"text": "a", "finish_reason": "stop", "stop_reason": "##"}]}
    assert wire.completion_whole(whole)[-1].stop_sequence == "##"
