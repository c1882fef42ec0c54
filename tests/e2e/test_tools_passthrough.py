"""Tools and response formats reach an engine process unchanged, and its tool calls come
back as they came: llama-cpp-python's own server (`python -m llama_cpp.server`) on SmolLM2
as a managed `llama_server` model. That server constrains a named function's arguments with
its own grammar and answers `json_object` formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from tests.conftest import sdk, serving
from tests.e2e.schemas import ADD_TOOL, WEATHER_TOOL
from tests.e2e.test_managed_engines import ENGINE, engine_config


async def test_named_tool_calls_and_json_mode_pass_through_the_engine(tmp_path: Path) -> None:
    async with serving(engine_config(tmp_path)) as (_, client):
        oai = sdk(client)
        request: dict[str, Any] = {
            "model": ENGINE,
            "messages": [{"role": "user", "content": "What's the weather in Rome?"}],
            "tools": [WEATHER_TOOL, ADD_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 60,
            "temperature": 0,
        }
        whole = await oai.chat.completions.create(**request)
        [call] = whole.choices[0].message.tool_calls or []
        assert call.type == "function"
        assert call.function.name == "get_weather" and call.id
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])

        async with oai.chat.completions.stream(**request) as stream:
            streamed = await stream.get_final_completion()
        # Assembled by the SDK from the pieces: one call, named once. (That server's stream
        # and whole paths sample differently, so the arguments are checked, not compared.)
        [streamed_call] = streamed.choices[0].message.tool_calls or []
        assert streamed_call.function.name == "get_weather" and streamed.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(streamed_call.function.arguments), WEATHER_TOOL["function"]["parameters"])

        json_mode = await oai.chat.completions.create(
            model=ENGINE,
            messages=[{"role": "user", "content": "Give me a JSON object with a name and an age."}],
            response_format={"type": "json_object"},
            max_tokens=300,
            temperature=0,
        )
        assert isinstance(json.loads(json_mode.choices[0].message.content or ""), dict)
