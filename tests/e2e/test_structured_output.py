"""Structured output and tool calls on real SmolLM2, on both local engines (llama.cpp and
transformers), through the official openai SDK: constrained replies always validate
against their schema, tool calls name a known function with valid arguments, and streamed
calls assemble to the non-streamed reply."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionToolChoiceOptionParam
from openai.types.shared_params import ResponseFormatJSONSchema

from tests.conftest import CHAT_MODEL, HF_MODEL, sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.e2e.schemas import ADD_TOOL, PROMPTS, SCHEMAS, WEATHER_TOOL

BACKENDS = [CHAT_MODEL, HF_MODEL]
REQUESTS_PER_BACKEND = 100


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    cli = {"enabled_models": BACKENDS, "models": {HF_MODEL: {"preload": True}}}
    async with serving(cli) as (app, http):
        for model in BACKENDS:
            await app.state.pool.slot(model).ensure_ready(None)
        yield http


@pytest.fixture(scope="module")
def oai(client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return sdk(client)


def json_schema_format(name: str) -> ResponseFormatJSONSchema:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.mark.parametrize("model", BACKENDS)
async def test_a_hundred_constrained_replies_all_validate(oai: openai.AsyncOpenAI, model: str) -> None:
    names = list(itertools.islice(itertools.cycle(SCHEMAS), REQUESTS_PER_BACKEND))
    in_flight = asyncio.Semaphore(16)  # within the model's queue limit

    async def ask(index: int, name: str) -> tuple[str, str, str]:
        async with in_flight:
            reply = await oai.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": PROMPTS[name]}],
                response_format=json_schema_format(name),
                max_tokens=200,
                temperature=0.8,
                seed=index,
            )
        choice = reply.choices[0]
        return name, choice.message.content or "", choice.finish_reason

    replies = await asyncio.gather(*(ask(i, name) for i, name in enumerate(names)))
    assert len({name for name, _, _ in replies}) >= 10
    # Sampled at 0.8, a reply may now and then run away inside an unbounded string (a chain
    # of emoji, seen once in 100 on llama.cpp) until max_tokens: it stops with "length", cut
    # off as OpenAI's API cuts it. Everything that stopped by itself must validate.
    cut = [(name, text) for name, text, finish in replies if finish == "length"]
    assert len(cut) <= 2, cut
    for name, text, finish in replies:
        if finish != "length":
            assert finish == "stop", (name, text)
            jsonschema.validate(json.loads(text), SCHEMAS[name])
    assert len({text for _, text, _ in replies}) > len(SCHEMAS)  # sampled, not one canned answer per schema


@pytest.mark.parametrize("model", BACKENDS)
async def test_json_object_mode_gives_an_object(oai: openai.AsyncOpenAI, model: str) -> None:
    reply = await oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give me a JSON object with a name and an age."}],
        response_format={"type": "json_object"},
        max_tokens=300,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("model", BACKENDS)
async def test_a_named_tool_call_has_arguments_matching_its_parameters(oai: openai.AsyncOpenAI, model: str) -> None:
    reply = await oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What's the weather like in Lisbon?"}],
        tools=[WEATHER_TOOL, ADD_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=100,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


@pytest.mark.parametrize("model", BACKENDS)
async def test_required_calls_one_of_the_tools_with_valid_arguments(oai: openai.AsyncOpenAI, model: str) -> None:
    tools = {"get_weather": WEATHER_TOOL, "add": ADD_TOOL}
    for question in ["What is 17 plus 25?", "Is it raining in Oslo?"]:
        reply = await oai.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            tools=list(tools.values()),
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=100,
            temperature=0,
        )
        calls = reply.choices[0].message.tool_calls or []
        assert len(calls) == 1 and reply.choices[0].finish_reason == "tool_calls"
        assert calls[0].type == "function"
        schema = tools[calls[0].function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(calls[0].function.arguments), schema)


@pytest.mark.parametrize("model", BACKENDS)
async def test_streamed_tool_call_deltas_assemble_to_the_whole_reply(oai: openai.AsyncOpenAI, model: str) -> None:
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Add 120 and 7."}],
        "tools": [ADD_TOOL, WEATHER_TOOL],
        "tool_choice": "required",
        "max_tokens": 100,
        "temperature": 0,
    }
    whole = await oai.chat.completions.create(**request)
    deltas = []
    async with oai.chat.completions.stream(**request) as stream:
        async for event in stream:
            if event.type == "chunk" and event.chunk.choices and event.chunk.choices[0].delta.tool_calls:
                deltas += event.chunk.choices[0].delta.tool_calls
        streamed = await stream.get_final_completion()
    assert deltas[0].id and deltas[0].function and deltas[0].function.name  # id and name come first
    assert sum(1 for d in deltas if d.function and d.function.arguments) > 1  # arguments in pieces
    whole_calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    streamed_message = streamed.choices[0].message
    streamed_calls = [(c.function.name, c.function.arguments) for c in streamed_message.tool_calls or []]
    assert streamed_calls == whole_calls and whole_calls
    assert streamed.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", BACKENDS)
async def test_an_agent_loop_calls_reads_the_result_and_answers(oai: openai.AsyncOpenAI, model: str) -> None:
    """As agent frameworks run it: call tools while the model asks for them (at most three
    rounds, the last one with `tool_choice: none` so it must answer), then a final answer."""
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    rounds_with_calls = 0
    choices: list[ChatCompletionToolChoiceOptionParam] = ["required", "auto", "none"]
    for tool_choice in choices:
        reply = await oai.chat.completions.create(
            model=model, messages=messages, tools=[WEATHER_TOOL], tool_choice=tool_choice,
            parallel_tool_calls=False, max_tokens=150, temperature=0,
        )  # fmt: skip
        message = reply.choices[0].message
        if not message.tool_calls:
            break
        assert reply.choices[0].finish_reason == "tool_calls"
        rounds_with_calls += 1
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:  # the model may ask for several units at once: answer each call
            assert call.type == "function"
            assert call.function.name == "get_weather"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21})})
    assert rounds_with_calls >= 1 and message.content and not message.tool_calls
    assert reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("model", BACKENDS)
async def test_auto_mode_answers_plain_text_or_a_well_formed_call(oai: openai.AsyncOpenAI, model: str) -> None:
    for question in ["Hello! How are you?", "What is 3 plus 4? Use the add tool."]:
        reply = await oai.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            tools=[ADD_TOOL],
            max_tokens=60,
            temperature=0,
        )
        message = reply.choices[0].message
        if message.tool_calls:
            assert message.tool_calls[0].type == "function"
            assert reply.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "add"
            arguments = json.loads(message.tool_calls[0].function.arguments)
            jsonschema.validate(arguments, ADD_TOOL["function"]["parameters"])
        else:
            assert message.content and not message.content.lstrip().startswith('{"tool_calls"')


async def test_generate_extracts_json_for_every_prompt(client: httpx.AsyncClient) -> None:
    schema = SCHEMAS["person"]
    prompts = [f"Person number {i} as JSON:" for i in range(6)]
    for model in BACKENDS:
        response = await client.post(
            "/generate", json={"model": model, "prompts": prompts, "json_schema": schema, "max_tokens": 80}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["finish_reasons"] == ["stop"] * len(prompts)
        for text in body["completions"]:
            jsonschema.validate(json.loads(text), schema)


HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call functions. Signatures:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\nFor each call, return a JSON object "
    'with the function name and arguments within <tool_call></tool_call> tags.<|im_end|>\n{% endif %}'
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.tool_calls %}"
    "{% for call in message.tool_calls %}<tool_call>\n{{ call.function | tojson }}\n</tool_call>{% endfor %}"
    "{% else %}{{ message.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A Qwen/Hermes-style template that takes `tools`: the model's reply is parsed as hermes."""


async def test_a_template_with_tools_gets_its_own_format_parsed_as_hermes() -> None:
    model = "smollm2-hermes"
    config = {"backend": "llama_cpp", "source": str(smollm2_gguf()), "options": {"chat_template": HERMES_TEMPLATE}}
    async with serving({"enabled_models": [model], "models": {model: config}}) as (app, http):
        reply = await sdk(http).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Add 2 and 40."}],
            tools=[ADD_TOOL, WEATHER_TOOL],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=120,
            temperature=0,
        )
        backend = app.state.pool.slot(model).replicas.members[0].backend
        rendered = backend._template.render([{"role": "user", "content": "x"}], [ADD_TOOL])
    [call] = reply.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
    assert "<tools>" in rendered and '"name": "add"' in rendered  # the template itself showed the tools
    jsonschema.validate(json.loads(call.function.arguments), ADD_TOOL["function"]["parameters"])
