"""JSON schemas and prompts for the structured-output tests: nested objects, arrays, enums,
required and optional fields, numbers with bounds, string lengths and patterns. Every string
and array is bounded, so a constrained reply always ends inside the token budget."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionFunctionToolParam

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "color": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "numbers": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9},
                        "minItems": 2, "maxItems": 4},
        },
        "required": ["numbers"],
        "additionalProperties": False,
    },
    "address": {
        "type": "object",
        "properties": {
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            }
        },
        "required": ["address"],
        "additionalProperties": False,
    },
    "score": {
        "type": "object",
        "properties": {"passed": {"type": "boolean"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["passed", "score"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 16},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 10},
                    },
                    "required": ["name", "qty"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    "article": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 3, "maxLength": 40},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        },
        "required": ["title"],
        "additionalProperties": False,
    },
    "count": {
        "type": "object",
        "properties": {"count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 100}},
        "required": ["count"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {"kind": {"const": "event"}, "level": {"enum": [1, 2, 3]}},
        "required": ["kind", "level"],
        "additionalProperties": False,
    },
    "code": {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 6, "pattern": "^[A-Z]+$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "temperature": {
        "type": "object",
        "properties": {
            "celsius": {"type": "number", "minimum": -40, "maximum": 50},
            "unit": {"enum": ["C", "F"]},
        },
        "required": ["celsius", "unit"],
        "additionalProperties": False,
    },
}

PROMPTS: dict[str, str] = {
    "person": "Invent a person. Reply in JSON.",
    "color": "What color is the sky? Reply in JSON.",
    "numbers": "Give me some small numbers as JSON.",
    "address": "Write an address in Paris as JSON.",
    "score": "Grade this essay: 'The cat sat.' Reply in JSON.",
    "order": "I want two apples and a pear. Write the order as JSON.",
    "article": "Suggest a title and tags for a blog post about cooking, as JSON.",
    "count": "How many legs does a spider have? Reply in JSON.",
    "event": "Log an event as JSON.",
    "code": "Make up an airport code as JSON.",
    "temperature": "What is a warm day's temperature? Reply in JSON.",
}

WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}

ADD_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
