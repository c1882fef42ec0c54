"""Tool calling and structured output on the wire (fast, no models): the exact request
bodies the SDK sends to a scripted OpenAI-shaped server on loopback, and how it reads
tool calls (whole and streamed in pieces) and validated answers back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from modelpool.client import (
    ChatDelta,
    ChatMessage,
    ChatResult,
    ClientError,
    LLMClient,
    ParsedChat,
    StructuredOutputError,
    ToolArgumentsError,
    ToolCall,
    ToolCallAccumulator,
    ToolCallDelta,
    parse_models_config,
    parse_structured,
    sync,
    tool_schema,
)
from modelpool.client.config import Endpoint
from modelpool.client.presets import PRESETS
from modelpool.client.results import chat_result
from modelpool.client.tools import closed, tool_choice_value
from tests.client.helpers import ScriptedServer

HISTORY = [ChatMessage.user("Weather in Paris?")]


def get_weather(city: Annotated[str, Field(description="A city name")], unit: Literal["C", "F"] = "C") -> str:
    """The weather now in a city."""
    return f"18 {unit} in {city}"


class Booking(BaseModel):
    """Book a table."""

    restaurant: str
    people: int = Field(ge=1)


class Nothing(BaseModel):
    """A tool without parameters (servers may send "" as its arguments)."""


class City(BaseModel):
    name: str
    population: int


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"description": "A city name", "title": "City", "type": "string"},
                "unit": {"default": "C", "enum": ["C", "F"], "title": "Unit", "type": "string"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
BOOKING: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "Booking",
        "description": "Book a table.",
        "parameters": {
            "description": "Book a table.",
            "properties": {
                "restaurant": {"title": "Restaurant", "type": "string"},
                "people": {"minimum": 1, "title": "People", "type": "integer"},
            },
            "required": ["restaurant", "people"],
            "title": "Booking",
            "type": "object",
            "additionalProperties": False,
        },
    },
}
CITY_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "City",
        "schema": {
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "population": {"title": "Population", "type": "integer"},
            },
            "required": ["name", "population"],
            "title": "City",
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function",
     "function": {"name": "Booking", "arguments": '{"restaurant": "Chez Lu", "people": 2}'}},
]  # fmt: skip
USAGE = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}


def reply(finish_reason: str = "stop", **message: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "m", "choices": [choice], "usage": USAGE}


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}  # fmt: skip


def piece(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    """A streamed tool-call piece as OpenAI sends it: id, type and name only in the first."""
    if call_id is None:
        return {"index": index, "function": {"arguments": arguments}}
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def endpoint(url: str, **fields: object) -> Endpoint:
    spec = {"kind": "openai_compat", "base_url": url, "model_name": "m", "health_check": False, **fields}
    return parse_models_config({"llm": spec}, environ={}).endpoint("llm")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture
async def llm(server: ScriptedServer) -> AsyncIterator[LLMClient]:
    async with LLMClient(endpoint(server.url), server.url) as client:
        yield client


def test_a_function_a_pydantic_class_and_a_dict_become_openai_tools() -> None:
    assert tool_schema(get_weather) == WEATHER
    assert tool_schema(Booking) == BOOKING
    # The model's own schema, closed to fields it does not declare (OpenAI's strict mode).
    assert BOOKING["function"]["parameters"] == {**Booking.model_json_schema(), "additionalProperties": False}
    assert tool_schema(SEARCH) == SEARCH and tool_schema(SEARCH) is not SEARCH


def no_args() -> str:
    return "ok"


def test_a_function_without_parameters_or_docstring() -> None:
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}
    assert tool_schema(no_args) == {"type": "function", "function": {"name": "no_args", "parameters": parameters}}


def star_args(*cities: str) -> None: ...
def star_kwargs(**options: str) -> None: ...
def positional(city: str, /) -> None: ...
def undefined_hint(city: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize(
    ("tool", "complaint"),
    [
        (star_args, "parameter 'cities' is \\*args"),
        (star_kwargs, "parameter 'options' is \\*\\*kwargs"),
        (positional, "parameter 'city' is positional-only"),
        (undefined_hint, "tool 'undefined_hint': its parameters have no JSON schema .*NoSuchType"),
        (lambda city: city, "'<lambda>' cannot be a tool's name"),
        (42, "not int"),
    ],
)
def test_tools_that_cannot_be_called_by_name_are_refused(tool: Any, complaint: str) -> None:
    with pytest.raises(TypeError, match=complaint):
        tool_schema(tool)


async def test_chat_sends_the_tools_and_reads_the_calls(server: ScriptedServer, llm: LLMClient) -> None:
    server.answer_json(reply("tool_calls", content=None, tool_calls=CALLS))
    result = await llm.chat(HISTORY, tools=[get_weather, Booking, SEARCH], tool_choice="required",
                            parallel_tool_calls=False, max_tokens=64)  # fmt: skip
    assert server.requests == [("/v1/chat/completions", {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 64,
        "tools": [WEATHER, BOOKING, SEARCH],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    })]  # fmt: skip
    assert type(result) is ChatResult
    assert (result.content, result.finish_reason) == ("", "tool_calls")
    assert result.tool_calls == (
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_2", "Booking", '{"restaurant": "Chez Lu", "people": 2}'),
    )
    weather, booking = result.tool_calls
    assert get_weather(**weather.args) == "18 C in Paris"
    assert booking.parse(Booking) == Booking(restaurant="Chez Lu", people=2)


async def test_a_named_tool_choice_goes_as_a_function_object(server: ScriptedServer, llm: LLMClient) -> None:
    server.answer_json(reply(content="ok"))
    await llm.chat(HISTORY, tools=[get_weather], tool_choice="get_weather")
    assert server.bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "parallel_tool_calls" not in server.bodies[0] and "response_format" not in server.bodies[0]


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("Booking", {"type": "function", "function": {"name": "Booking"}}),
        (Booking, {"type": "function", "function": {"name": "Booking"}}),
        (get_weather, {"type": "function", "function": {"name": "get_weather"}}),
        (SEARCH, SEARCH),  # a dict is the caller's own tool_choice object: sent unchanged
        ({"type": "function", "function": {"name": "search"}}, {"type": "function", "function": {"name": "search"}}),
        (None, None),
    ],
)
def test_tool_choice_forms(choice: Any, sent: object) -> None:
    assert tool_choice_value(choice, [WEATHER, BOOKING, SEARCH]) == sent


async def test_a_tool_choice_naming_no_tool_is_refused_before_sending(server: ScriptedServer, llm: LLMClient) -> None:
    complaint = r"tool_choice names 'get_wether', which is not among the tools \(get_weather, Booking\)"
    with pytest.raises(ValueError, match=complaint):
        await llm.chat(HISTORY, tools=[get_weather, Booking], tool_choice="get_wether")
    assert server.requests == []


async def test_a_misspelt_option_is_refused_before_sending(server: ScriptedServer, llm: LLMClient) -> None:
    with pytest.raises(TypeError, match="unexpected chat option\\(s\\): tool_choise"):
        await llm.chat(HISTORY, tools=[get_weather], tool_choise="auto")  # type: ignore[call-overload]
    assert server.requests == []


def test_tool_call_arguments_parsed_and_refused() -> None:
    assert ToolCall("c", "no_args", "").args == {} and ToolCall("c", "Nothing", " ").parse(Nothing) == Nothing()
    broken = ToolCall("call_9", "get_weather", '{"city": "Par')
    with pytest.raises(ToolArgumentsError) as caught:
        _ = broken.args
    error = caught.value
    assert (error.tool_name, error.arguments) == ("get_weather", '{"city": "Par')
    assert error.message.startswith("the arguments of tool call 'get_weather' (id 'call_9') are not JSON (")
    assert error.message.endswith(""": '{"city": "Par'""")
    with pytest.raises(ToolArgumentsError, match=r"are JSON but not an object \(list\): '\[1, 2\]'"):
        _ = ToolCall("c", "f", "[1, 2]").args
    with pytest.raises(ToolArgumentsError, match=r"do not fit Booking \(people: Input should be greater than or equal"):
        ToolCall("c", "Booking", '{"restaurant": "Chez Lu", "people": 0}').parse(Booking)


def test_object_arguments_become_json_text() -> None:
    """Ollama-style servers send the arguments as an object; the SDK keeps JSON text."""
    raw = reply("tool_calls", content="", tool_calls=[{"id": "x", "function": {"name": "f", "arguments": {"a": [1]}}}])
    result = chat_result(raw, PRESETS["smollm2"].reasoning_fields)
    assert result.tool_calls == (ToolCall("x", "f", '{"a": [1]}'),) and result.tool_calls[0].args == {"a": [1]}


async def test_response_format_model_is_sent_strict_and_parsed(server: ScriptedServer, llm: LLMClient) -> None:
    server.answer_json(reply(content='{"name": "Paris", "population": 2102650}'))
    result = await llm.chat(HISTORY, response_format=City, temperature=0)
    assert server.bodies == [{"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                              "temperature": 0, "response_format": CITY_FORMAT}]  # fmt: skip
    assert CITY_FORMAT["json_schema"]["schema"] == {**City.model_json_schema(), "additionalProperties": False}
    assert isinstance(result, ParsedChat) and result.parsed == City(name="Paris", population=2102650)
    assert result.content == '{"name": "Paris", "population": 2102650}' and result.usage is not None


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ('{"name": "Paris"}', "population: Field required"),
        ("Paris, about two million people", "the value: Invalid JSON"),
    ],
)
async def test_an_answer_that_does_not_fit_raises_with_its_text(
    server: ScriptedServer, llm: LLMClient, answer: str, problem: str
) -> None:
    server.answer_json(reply(content=answer))
    with pytest.raises(StructuredOutputError) as caught:
        await llm.chat(HISTORY, response_format=City)
    assert caught.value.text == answer
    assert caught.value.message.startswith(f"the answer is not a valid City ({problem}")
    assert caught.value.message.endswith(f"; the answer: {answer!r}")


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}],
)
async def test_response_format_dicts_pass_unchanged(
    server: ScriptedServer, llm: LLMClient, response_format: dict[str, Any]
) -> None:
    server.answer_json(reply(content='{"any": "thing"}'))
    result = await llm.chat(HISTORY, response_format=response_format)
    assert server.bodies[0]["response_format"] == response_format
    assert type(result) is ChatResult and json.loads(result.content) == {"any": "thing"}


async def test_a_tool_call_instead_of_a_parsed_answer(server: ScriptedServer, llm: LLMClient) -> None:
    """With tools and a response format both, the model may call a tool first: the result
    carries the calls, and `.parsed` says why there is nothing to parse yet."""
    server.answer_json(reply("tool_calls", content=None, tool_calls=CALLS[:1]))
    result = await llm.chat(HISTORY, tools=[get_weather], response_format=City)
    assert [call.name for call in result.tool_calls] == ["get_weather"]
    with pytest.raises(StructuredOutputError, match="the model called tools instead of answering"):
        _ = result.parsed


STREAMED = [
    chunk({"role": "assistant", "content": None}),
    chunk({"tool_calls": [piece(0, "", "call_1", "get_weather")]}),
    chunk({"tool_calls": [piece(0, '{"city": ')]}),
    chunk({"tool_calls": [piece(1, '{"restaurant": ', "call_2", "Booking")]}),  # interleaved, arguments at once
    chunk({"tool_calls": [piece(0, '"Paris"}')]}),
    chunk({"tool_calls": [piece(1, '"Chez Lu", "people": 2}')]}),
    chunk({}, "tool_calls"),
    {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": USAGE},
]


async def test_stream_chat_sends_tools_and_the_pieces_join_into_calls(server: ScriptedServer, llm: LLMClient) -> None:
    server.answer_sse(STREAMED)
    calls = ToolCallAccumulator()
    deltas = []
    async for delta in llm.stream_chat(HISTORY, tools=[get_weather, Booking], tool_choice="auto"):
        calls.add(delta)
        deltas.append(delta)
    assert server.bodies == [{"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                              "tools": [WEATHER, BOOKING], "tool_choice": "auto", "stream": True,
                              "stream_options": {"include_usage": True}}]  # fmt: skip
    assert [d.tool_calls for d in deltas] == [
        (),
        (ToolCallDelta(0, "call_1", "get_weather", ""),),
        (ToolCallDelta(0, None, None, '{"city": '),),
        (ToolCallDelta(1, "call_2", "Booking", '{"restaurant": '),),
        (ToolCallDelta(0, None, None, '"Paris"}'),),
        (ToolCallDelta(1, None, None, '"Chez Lu", "people": 2}'),),
        (),
        (),
    ]
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]
    assert deltas[-1].usage is not None and deltas[-1].usage.total_tokens == 42
    assert calls.calls() == (
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_2", "Booking", '{"restaurant": "Chez Lu", "people": 2}'),
    )


async def test_an_endpoint_without_streaming_streams_one_whole_answer(server: ScriptedServer) -> None:
    server.answer_json(reply("tool_calls", content="Checking.", tool_calls=CALLS))
    server.answer_json(reply(content='{"name": "Paris", "population": 1}'))
    async with LLMClient(endpoint(server.url, capabilities={"streaming": False}), server.url) as llm:
        calls = ToolCallAccumulator()
        deltas = [d async for d in llm.stream_chat(HISTORY, tools=[get_weather])]
        for delta in deltas:
            calls.add(delta)
        formatted = [d async for d in llm.stream_chat(HISTORY, response_format=City)]
    assert [(d.content, d.finish_reason) for d in deltas] == [("Checking.", "tool_calls")]
    assert calls.calls() == (
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_2", "Booking", '{"restaurant": "Chez Lu", "people": 2}'),
    )
    assert "stream" not in server.bodies[0] and server.bodies[1]["response_format"] == CITY_FORMAT
    text = "".join(d.content for d in formatted)
    assert parse_structured(City, text) == City(name="Paris", population=1)


def test_the_accumulator_takes_pieces_and_refuses_a_call_without_a_name() -> None:
    calls = ToolCallAccumulator()
    calls.add(ToolCallDelta(0, "a", "f", '{"x"'))
    calls.add(ChatDelta(content="text only"))
    calls.add(ToolCallDelta(0, None, None, ": 1}"))
    assert calls.calls() == (ToolCall("a", "f", '{"x": 1}'),)
    calls.add(ToolCallDelta(3, "b", None, "{}"))
    with pytest.raises(ClientError, match=r"the stream's tool call #3 never named its function \(id 'b'\)"):
        calls.calls()


def test_parse_structured_quotes_a_long_answer_cut_but_keeps_it_whole() -> None:
    answer = "x" * 2500
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured(City, answer)
    assert caught.value.text == answer
    assert caught.value.message.endswith(repr("x" * 2000) + "… (2500 characters)")


async def test_a_tool_round_goes_back_in_the_history(server: ScriptedServer, llm: LLMClient) -> None:
    server.answer_json(reply("tool_calls", content=None, tool_calls=CALLS))
    server.answer_json(reply(content="18 °C in Paris, and your table is booked."))
    first = await llm.chat(HISTORY, tools=[get_weather, Booking])
    weather, booking = first.tool_calls
    history = [*HISTORY, ChatMessage.from_result(first), ChatMessage.tool(weather.id, get_weather(**weather.args)),
               ChatMessage.tool(booking.id, {"booked": True, "table": 4})]  # fmt: skip
    final = await llm.chat(history, tools=[get_weather, Booking])
    assert server.bodies[1]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "content": "18 C in Paris", "tool_call_id": "call_1"},
        {"role": "tool", "content": '{"booked": true, "table": 4}', "tool_call_id": "call_2"},
    ]
    assert final.content == "18 °C in Paris, and your table is booked." and final.tool_calls == ()


def test_assistant_messages_with_and_without_calls() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    assert ChatMessage.assistant("Let me look.", tool_calls=[call]).to_wire() == {
        "role": "assistant", "content": "Let me look.", "tool_calls": [CALLS[0]]}  # fmt: skip
    assert ChatMessage.assistant("Hi.").to_wire() == {"role": "assistant", "content": "Hi."}
    assert ChatMessage.assistant().to_wire() == {"role": "assistant", "content": ""}
    city = ChatMessage.tool("call_3", City(name="Lyon", population=5))
    assert city.to_wire() == {"role": "tool", "content": '{"name":"Lyon","population":5}', "tool_call_id": "call_3"}
    assert ChatMessage.tool("call_4", [1.5, None]).content == "[1.5, null]"


def test_the_sync_facade_sends_and_reads_the_same(server: ScriptedServer) -> None:
    server.answer_json(reply("tool_calls", content=None, tool_calls=CALLS[:1]))
    server.answer_json(reply(content='{"name": "Paris", "population": 3}'))
    server.answer_sse(STREAMED)
    with sync.SyncLLM(LLMClient(endpoint(server.url), server.url)) as llm:
        called = llm.chat(HISTORY, tools=[get_weather], tool_choice=get_weather)
        city = llm.chat(HISTORY, response_format=City).parsed
        calls = ToolCallAccumulator()
        for delta in llm.stream_chat(HISTORY, tools=[get_weather, Booking], parallel_tool_calls=True):
            calls.add(delta)
    assert called.tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    assert server.bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert city == City(name="Paris", population=3) and server.bodies[1]["response_format"] == CITY_FORMAT
    assert server.bodies[2]["parallel_tool_calls"] is True and [c.id for c in calls.calls()] == ["call_1", "call_2"]


def test_nested_models_are_closed_at_every_level_unless_they_say_otherwise() -> None:
    class Address(BaseModel):
        city: str

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        note: str

    class Person(BaseModel):
        home: Address
        extra: Open

    schema = closed(Person.model_json_schema())
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Address"]["additionalProperties"] is False
    assert schema["$defs"]["Open"]["additionalProperties"] is True  # the model says so
