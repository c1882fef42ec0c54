"""Tools and structured output on the request side: what `tools`, `tool_choice` and
`response_format` become in the OpenAI Chat Completions body.

A tool is given as the OpenAI dict itself, or as what a Python program already has:

- a function: its name, its docstring as the description, and its parameters' JSON
  schema from the signature (pydantic's `TypeAdapter(function)`: type hints, defaults,
  `Annotated[T, Field(description=...)]` to describe a parameter; an unannotated
  parameter takes any JSON value);
- a pydantic model class: its name, its docstring, `model_json_schema()` as parameters
  (read the call back with `call.parse(Model)`).

    def get_weather(city: Annotated[str, Field(description="A city name")], unit: Literal["C", "F"] = "C") -> str:
        \"\"\"The weather now in a city.\"\"\"

    reply = await llm.chat(history, tools=[get_weather], tool_choice="get_weather")

Only the schema is built here: the SDK never calls the function (the caller runs
`reply.tool_calls`, see results.ToolCall).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pydantic import BaseModel, PydanticUserError, TypeAdapter

ToolLike = Mapping[str, Any] | Callable[..., Any] | type[BaseModel]
"""An OpenAI tool dict (sent unchanged), a function, or a pydantic model class."""
ToolChoice = str | ToolLike
"""`"auto"`, `"none"`, `"required"`, a function's name, a tool given as above (that
function), or an OpenAI tool_choice dict (sent unchanged)."""
ResponseFormat = type[BaseModel] | Mapping[str, Any] | None
"""A pydantic model class (sent as a strict json_schema; the answer is validated into it),
or an OpenAI response_format dict such as `{"type": "json_object"}` (sent unchanged)."""

MODES = ("auto", "none", "required")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What OpenAI-compatible servers accept as a function name."""
_UNSENDABLE = {
    inspect.Parameter.POSITIONAL_ONLY: "is positional-only",
    inspect.Parameter.VAR_POSITIONAL: "is *args",
    inspect.Parameter.VAR_KEYWORD: "is **kwargs",
}
"""Parameter kinds a call by keyword (`fn(**call.args)`) cannot fill from named arguments."""


def tool_schema(tool: ToolLike) -> dict[str, Any]:
    """The OpenAI tool dict a tool is sent as (`{"type": "function", "function": {...}}`).
    Raises TypeError for anything that is not a dict, a function or a pydantic model class."""
    if isinstance(tool, Mapping):
        return dict(tool)
    if isinstance(tool, type) and issubclass(tool, BaseModel):
        return _function(tool.__name__, inspect.cleandoc(tool.__doc__ or ""), closed(tool.model_json_schema()))
    if callable(tool):
        return _function(tool_name(tool), inspect.getdoc(tool) or "", parameters_schema(tool))
    raise TypeError(f"a tool is an OpenAI tool dict, a function or a pydantic model class, not {type(tool).__name__}")


def tool_name(tool: ToolLike) -> str:
    """The function name a tool is sent under: a dict's own, else the `__name__`, which
    must be a name the API accepts (a lambda's `<lambda>` is not: wrap it in a def)."""
    if isinstance(tool, Mapping):
        return str((tool.get("function") or {}).get("name") or "")
    name = getattr(tool, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"{tool!r} has no __name__ to call it by: pass a function, a model class or an OpenAI dict")
    if not NAME.fullmatch(name):
        raise TypeError(f"{name!r} cannot be a tool's name: the API takes 1-64 letters, digits, '_' and '-'")
    return name


def parameters_schema(function: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a function's parameters, as pydantic validates a call to it
    (`TypeAdapter(function)`: no other argument allowed). Every parameter must be
    passable by name, since the call comes back as named JSON arguments."""
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in _UNSENDABLE:
            raise TypeError(f"tool {tool_name(function)!r}: parameter {name!r} {_UNSENDABLE[parameter.kind]}; "
                            "a tool's parameters must be passable by name")  # fmt: skip
    try:  # pydantic types its argument as a type form, but takes a function too: its call schema
        return TypeAdapter(cast(Any, function)).json_schema()
    except (NameError, PydanticUserError) as exc:  # a hint naming nothing defined, a type JSON cannot carry
        raise TypeError(f"tool {tool_name(function)!r}: its parameters have no JSON schema ({exc})") from exc


def tool_choice_value(choice: ToolChoice | None, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any] | None:
    """tool_choice as sent: a mode as is, a name or tool as `{"type": "function", ...}`.
    A name that none of `tools` has raises ValueError here, not as a server 400 later."""
    if choice is None or (isinstance(choice, str) and choice in MODES):
        return choice
    if isinstance(choice, Mapping):
        return dict(choice)
    name = choice if isinstance(choice, str) else tool_name(choice)
    known = [tool_name(tool) for tool in tools]
    if tools and name not in known:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(known)})")
    return {"type": "function", "function": {"name": name}}


def response_format_value(response_format: ResponseFormat) -> dict[str, Any] | None:
    """response_format as sent: a model class as a strict json_schema, a dict unchanged."""
    if response_format is None:
        return None
    if isinstance(response_format, Mapping):
        return dict(response_format)
    schema = {"name": response_format.__name__, "schema": closed(response_format.model_json_schema()), "strict": True}
    return {"type": "json_schema", "json_schema": schema}


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that does not say
    otherwise, as OpenAI's strict mode requires. A model's own schema leaves it out (pydantic
    ignores unknown keys by default), and a server that enforces the schema would then let a
    model add fields of its own without bound."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    if (result.get("type") == "object" or "properties" in result) and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if not description:
        del function["description"]
    return {"type": "function", "function": function}
