"""Tools and structured output on the wire (chat completions and responses share these):
function definitions, `tool_choice`, `response_format`, and their checks.

JSON schemas are checked against the JSON-schema metaschema here, so a malformed one is a
400 naming its field on every backend; whether a local engine can enforce it is checked
when its grammar is compiled (also a 400). The check costs CPU in proportion to the schema,
so it runs where the request is translated, off the event loop (`sizes.translated`), after
the schema is measured against the server's caps (413 naming the cap).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.inference import ChatMessage, OutputFormat, Tool, ToolCall, ToolCallDelta, ToolChoice
from modelpool.tools.metaschema import problem_now
from modelpool.wire.common import Text, WireModel
from modelpool.wire.sizes import current_limits, defer_metaschema_check, schema_budget

FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class FunctionDefinition(WireModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(WireModel):
    """`{"type": "function", "function": {...}}` (chat completions)."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(WireModel):
    name: str = Field(min_length=1)


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(WireModel):
    name: str = Field(min_length=1)
    arguments: Text


class MessageToolCall(WireModel):
    """A call in an assistant message of the history."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: CalledFunction


class TextFormat(WireModel):
    type: Literal["text"]


class JsonObjectFormat(WireModel):
    type: Literal["json_object"]


class JsonSchemaSpec(WireModel):
    name: str = Field(default="response", pattern=FUNCTION_NAME)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


def check_schema(schema: Mapping[str, Any], param: str) -> None:
    """A JSON schema must be one (the metaschema of its draft, 2020-12 when unsaid), and fit
    what is left of the request's schema allowance (measured first: a schema over it costs
    no metaschema check). Inside `sizes.translated` the metaschema check is left to it, to
    await off the loop; elsewhere it is done here."""
    schema_budget().charge(schema, param)
    text = json.dumps(schema, sort_keys=True)
    if defer_metaschema_check(text, param):
        return
    problem = problem_now(text)
    if problem is not None:
        raise InvalidRequest(problem, param=param)


def to_tools(functions: Sequence[FunctionDefinition], where_of: Callable[[int], str]) -> tuple[Tool, ...]:
    """Function definitions → tools; `where_of(i)` names the i-th definition's field
    (`tools[i].function` in chat completions, `tools[i]` in the Responses API)."""
    most = current_limits().tools
    if len(functions) > most:
        raise RequestTooLarge(f"the request has {len(functions)} tools, over {most} (server.max_tools)", param="tools")
    tools: list[Tool] = []
    seen: set[str] = set()
    for index, function in enumerate(functions):
        where = where_of(index)
        if function.name in seen:
            raise InvalidRequest(f"two tools are named '{function.name}'", param=f"{where}.name")
        seen.add(function.name)
        parameters = function.parameters if function.parameters is not None else {"type": "object", "properties": {}}
        check_schema(parameters, f"{where}.parameters")
        tools.append(Tool(function.name, function.description, parameters))
    return tuple(tools)


ChoiceMode = Literal["auto", "none", "required"]


def to_tool_choice(choice: ChoiceMode | None, named: str | None, tools: Sequence[Tool], param: str) -> ToolChoice:
    """`auto` (default with tools), `none` (default without), `required`, or a named function."""
    if named is not None:
        if named not in {t.name for t in tools}:
            known = ", ".join(t.name for t in tools) or "none"
            raise InvalidRequest(f"tool_choice names '{named}', which is not among the tools ({known})", param=param)
        return ToolChoice("function", named)
    mode: ChoiceMode = choice or ("auto" if tools else "none")
    if mode == "required" and not tools:
        raise InvalidRequest("tool_choice 'required' needs tools", param=param)
    return ToolChoice(mode)


def to_output(kind: str, schema: Mapping[str, Any] | None, param: str, name: str = "response") -> OutputFormat | None:
    """A response format → what the output must be (None: plain text)."""
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat("json_object")
    if schema is None:
        raise InvalidRequest("a json_schema response format needs a schema", param=param)
    check_schema(schema, param)
    return OutputFormat("json_schema", schema, name)


def to_tool_calls(calls: Sequence[MessageToolCall]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in calls)


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_delta_json(piece: ToolCallDelta) -> dict[str, Any]:
    """OpenAI's streamed shape: the first piece of a call has its id, type and name."""
    function: dict[str, Any] = {"arguments": piece.arguments}
    item: dict[str, Any] = {"index": piece.index}
    if piece.id is not None:
        item.update(id=piece.id, type="function")
    if piece.name is not None:
        function = {"name": piece.name, **function}
    item["function"] = function
    return item


def format_output(response_format: ResponseFormat | None, param: str) -> OutputFormat | None:
    """A chat `response_format` → what the output must be (None: plain text)."""
    if response_format is None:
        return None
    if isinstance(response_format, JsonSchemaFormat):
        spec = response_format.json_schema
        return to_output("json_schema", spec.schema_, param, spec.name)
    return to_output(response_format.type, None, param)


def check_tool_results(messages: Sequence[ChatMessage], where: Callable[[int], str] | None = None) -> None:
    """Every tool message answers a call an earlier assistant message made. `where` names
    the field of message `i` (default: `messages[i].tool_call_id`)."""
    called: set[str] = set()
    for index, message in enumerate(messages):
        called.update(call.id for call in message.tool_calls)
        if message.role != "tool":
            continue
        param = where(index) if where is not None else f"messages[{index}].tool_call_id"
        if message.tool_call_id is None:
            raise InvalidRequest("a tool message needs the tool_call_id it answers", param=param)
        if message.tool_call_id not in called:
            raise InvalidRequest(
                f"tool_call_id '{message.tool_call_id}' matches no tool call of an earlier assistant message",
                param=param,
            )
