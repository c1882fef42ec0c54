"""Grammars that constrain decoding, in llguidance's Lark dialect: JSON that matches a
schema (`response_format`), and tool calls laid out the way a model family writes them.

A grammar is plain text, so it is also the cache key of its compiled form. The JSON
inside it allows a little whitespace between tokens but not unbounded runs: a small model
that starts emitting newlines inside an object would otherwise never stop.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from modelpool.inference import ChatRequest, OutputFormat, Tool, ToolChoice

JSON_WHITESPACE = r"[\x20\x0A]{0,16}"
"""Whitespace allowed between JSON tokens: enough to pretty-print, not enough to loop."""


class CallLayout(ABC):
    """How a model family writes its tool calls, for building the grammar that allows them.
    The parser of the same family (tools/parsers.py) reads them back."""

    def __init__(self, arguments_key: str, text_start: str) -> None:
        self.arguments_key = arguments_key
        """The key that holds the arguments object ("arguments"; "parameters" for Llama 3)."""
        self.text_start = text_start
        """A regex class for the first character of a plain-text answer in `auto` mode:
        anything but the character a call starts with, so a malformed call cannot pass as text."""

    @abstractmethod
    def calls(self, call_schema: Mapping[str, Any], parallel: bool) -> str:
        """The Lark expression of the calls of one reply (one, or several when `parallel`)."""


class _Tagged(CallLayout):
    """Each call wrapped in a marker pair, one after another (Hermes, Qwen)."""

    def __init__(self, open_tag: str, close_tag: str) -> None:
        super().__init__("arguments", r"[^<]")
        self.open_tag, self.close_tag = open_tag, close_tag

    def calls(self, call_schema: Mapping[str, Any], parallel: bool) -> str:
        call = f"{_literal(self.open_tag + chr(10))} {_json(call_schema)} {_literal(chr(10) + self.close_tag)}"
        return f"({call})" + (f" ({_literal(chr(10))} {call})*" if parallel else "")


class _Separated(CallLayout):
    """Bare call objects separated by `separator` (Llama 3.x JSON tool calling)."""

    def __init__(self, arguments_key: str, separator: str) -> None:
        super().__init__(arguments_key, r"[^{]")
        self.separator = separator

    def calls(self, call_schema: Mapping[str, Any], parallel: bool) -> str:
        call = _json(call_schema)
        return call + (f" ({_literal(self.separator)} {call})*" if parallel else "")


class _Listed(CallLayout):
    """A marker, then a JSON array of calls (Mistral's `[TOOL_CALLS][...]`)."""

    def __init__(self, marker: str) -> None:
        super().__init__("arguments", r"[^\[]")
        self.marker = marker

    def calls(self, call_schema: Mapping[str, Any], parallel: bool) -> str:
        items = {"type": "array", "items": call_schema, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return f"{_literal(self.marker)} {_json(items)}"


class _Wrapped(CallLayout):
    """One JSON object `{"tool_calls": [...]}` (the generic format, for chat templates that
    know no tools: the same as llama.cpp's server writes)."""

    def __init__(self) -> None:
        super().__init__("arguments", r"[^{]")

    def calls(self, call_schema: Mapping[str, Any], parallel: bool) -> str:
        items = {"type": "array", "items": call_schema, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        wrapper = {
            "type": "object",
            "properties": {"tool_calls": items},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        return _json(wrapper)


LAYOUTS: dict[str, CallLayout] = {
    "hermes": _Tagged("<tool_call>", "</tool_call>"),
    "llama3_json": _Separated("parameters", "; "),
    "mistral": _Listed("[TOOL_CALLS]"),
    "generic": _Wrapped(),
}
"""Tool-call layouts by parser family (the names a model's `tool_parser` takes)."""


def grammar_param(request: ChatRequest) -> str:
    """The request field to name when its grammar cannot be compiled."""
    calling = bool(request.tools) and request.tool_choice.mode != "none"
    return "tools" if calling else "response_format"


def output_schema(output: OutputFormat) -> Mapping[str, Any]:
    """The JSON schema a `response_format` asks for (`json_object`: any object)."""
    if output.kind == "json_schema" and output.schema is not None:
        return output.schema
    return {"type": "object"}


def output_grammar(output: OutputFormat) -> str:
    return f"start: {_json(output_schema(output))}\n"


def chat_grammar(
    tools: Sequence[Tool],
    choice: ToolChoice,
    family: str,
    *,
    parallel: bool,
    output: OutputFormat | None,
    constrain_auto: bool,
) -> str | None:
    """The grammar of a chat reply, or None when decoding is free.

    `required` or a named function: nothing but calls (to that function). `auto`: free text
    (or the `response_format` JSON) or calls, when `constrain_auto`; otherwise free unless a
    `response_format` is set.
    """
    calling = bool(tools) and choice.mode != "none"
    if not calling or (choice.mode == "auto" and not constrain_auto):
        return output_grammar(output) if output is not None else None
    selected = [t for t in tools if choice.mode != "function" or t.name == choice.name]
    layout = LAYOUTS[family]
    # A named function is called once, as OpenAI does; otherwise as many as allowed.
    calls = layout.calls(_call_schema(selected, layout.arguments_key), parallel and choice.mode != "function")
    if choice.mode in ("required", "function"):
        return f"start: {calls}\n"
    if output is not None:
        return f"start: {_json(output_schema(output))} | {calls}\n"
    return f"start: TEXT | {calls}\nTEXT: /{layout.text_start}(.|\\n)*/\n"


def _call_schema(tools: Sequence[Tool], arguments_key: str) -> dict[str, Any]:
    """One call to any of `tools`: its name, then its arguments, in that order (so a stream
    can announce the call before its arguments are written)."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, arguments_key: dict(tool.parameters)},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _json(schema: Mapping[str, Any]) -> str:
    guided = {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
    return "%json " + json.dumps(guided)


def _literal(text: str) -> str:
    return json.dumps(text)
