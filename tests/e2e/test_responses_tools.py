"""Function tools and structured text in the Responses API, through the official openai SDK
on SmolLM2 (llama.cpp): `function_call` output items, `function_call_output` input items (in
one request, and after `previous_response_id`), streamed argument events, `text.format`."""

from __future__ import annotations

import json
from typing import Any, cast

import jsonschema
import openai
from openai.types.responses import FunctionTool, FunctionToolParam
from openai.types.responses.response_input_item_param import FunctionCallOutput

from tests.conftest import CHAT_MODEL
from tests.e2e.schemas import SCHEMAS, WEATHER_TOOL

# cast: the SDK's type requires `strict`; the server (as OpenAI's API) takes a tool without it.
FUNCTION = cast(FunctionToolParam, {"type": "function", **WEATHER_TOOL["function"]})
PARAMETERS = WEATHER_TOOL["function"]["parameters"]


async def test_a_required_tool_gives_function_call_items(oai: openai.AsyncOpenAI) -> None:
    reply = await oai.responses.create(
        model=CHAT_MODEL, input="Weather in Madrid?", tools=[FUNCTION], tool_choice="required", temperature=0,
        parallel_tool_calls=False, store=False,
    )  # fmt: skip
    [call] = reply.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id is not None
    assert call.call_id is not None
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    # cast: only function tools were sent, so only function tools come back.
    assert reply.tool_choice == "required" and [cast(FunctionTool, t).name for t in reply.tools] == ["get_weather"]


async def test_call_output_items_continue_the_conversation(oai: openai.AsyncOpenAI) -> None:
    first = await oai.responses.create(
        model=CHAT_MODEL, input="Weather in Madrid?", tools=[FUNCTION], tool_choice="required", temperature=0,
        parallel_tool_calls=False,
    )  # fmt: skip
    [call] = first.output
    assert call.type == "function_call"
    result: FunctionCallOutput = {
        "type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 30}'
    }
    # Continued from the stored response: only the result is sent.
    stored = await oai.responses.create(
        model=CHAT_MODEL, previous_response_id=first.id, input=[result], tools=[FUNCTION], tool_choice="none",
        max_output_tokens=40, temperature=0,
    )  # fmt: skip
    assert stored.output[0].type == "message" and stored.output_text.strip()
    # Or the whole history in one request, the call item sent back as it came.
    history: list[Any] = [{"role": "user", "content": "Weather in Madrid?"}, call.model_dump(exclude_none=True), result]
    replayed = await oai.responses.create(
        model=CHAT_MODEL, input=history, tools=[FUNCTION], tool_choice="none", max_output_tokens=40, temperature=0,
        store=False,
    )  # fmt: skip
    assert replayed.output_text == stored.output_text


async def test_streamed_calls_send_argument_deltas_then_done(oai: openai.AsyncOpenAI) -> None:
    request: dict[str, Any] = {"model": CHAT_MODEL, "input": "Weather in Madrid?", "tools": [FUNCTION],
                               "tool_choice": "required", "temperature": 0, "parallel_tool_calls": False,
                               "store": False}  # fmt: skip
    whole = await oai.responses.create(**request)
    events = [event async for event in await oai.responses.create(**request, stream=True)]
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert len(deltas) > 1 and kinds[3 : 3 + len(deltas)] == ["response.function_call_arguments.delta"] * len(deltas)
    assert kinds[3 + len(deltas) :] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.metrics",  # llm-pool's event, before the final one (the SDK passes it through)
        "response.completed",
    ]
    added, done = events[2], events[3 + len(deltas)]
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    assert {d.item_id for d in deltas} == {added.item.id} and done.item_id == added.item.id
    arguments = "".join(d.delta for d in deltas)
    assert done.arguments == arguments == whole.output[0].arguments
    assert events[-1].response.output[0].arguments == arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_text_format_json_schema_is_enforced(oai: openai.AsyncOpenAI) -> None:
    schema = SCHEMAS["person"]
    reply = await oai.responses.create(
        model=CHAT_MODEL, input="Invent a person.", temperature=0.7, store=False,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(reply.output_text), schema)
    assert reply.text is not None
    assert reply.text.format is not None
    assert reply.text.format.type == "json_schema"
