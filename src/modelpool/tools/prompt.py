"""How a chat with tools reaches a local model: which family's format it speaks, the
messages and `tools` its chat template is rendered with, the grammar its reply is held to,
and the parser that reads its calls back.

A template that handles `tools` (Qwen, Llama 3.x, Mistral, Hermes, SmolLM3) gets them in
the Hugging Face layout and renders them the way the model was trained. A template with no
tool support (SmolLM2's) gets the generic format instead: the tools are described in the
system message and calls are a JSON object `{"tool_calls": [...]}`, as llama.cpp's server
does. Either way the reply is parsed by the family's parser.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import Environment, TemplateSyntaxError, meta

from modelpool.inference import ChatMessage, ChatRequest, ContentPart, TextPart, Tool, VideoInput
from modelpool.tools.grammar import chat_grammar, output_grammar

GENERIC_INSTRUCTIONS = (
    "You can call these tools (JSON schema of each one's arguments):\n{tools}\n\n"
    "To call tools, reply with only this JSON object and nothing else: "
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<the arguments>}}}}]}}\n'
    "Otherwise, reply to the user in plain text."
)
"""The generic format's system text; `{tools}` is the tools as JSON lines."""


@dataclass(frozen=True)
class ChatPlan:
    """What a local backend does with one chat request."""

    messages: list[dict[str, Any]]
    """Messages for the chat template, in the Hugging Face layout."""
    tools: list[dict[str, Any]] | None
    """The template's `tools` variable (None: the template is rendered without tools)."""
    grammar: str | None
    """The constraint on the reply (None: free decoding)."""
    parser: str | None
    """The tool parser family reading the reply (None: no calls possible)."""
    live: bool
    """Calls are constrained to be well-formed, so they stream as they are written."""


@lru_cache(maxsize=64)
def template_handles_tools(source: str) -> bool:
    """The chat template reads a `tools` variable (parsed once per template, not per request)."""
    try:
        return "tools" in meta.find_undeclared_variables(Environment().parse(source))
    except TemplateSyntaxError:
        return False


def detect_family(source: str | None) -> str:
    """The tool format a chat template teaches, from the markers it writes."""
    if not source or not template_handles_tools(source):
        return "generic"
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    return "hermes"  # the most common layout among templates that take tools


def plan_chat(
    request: ChatRequest, *, template_source: str | None, configured_parser: str | None, constrain_auto: bool
) -> ChatPlan:
    native = template_source is not None and template_handles_tools(template_source)
    # A template that knows no tools gets the generic format, whatever the configured
    # parser: the model is told that format in its system message.
    family = (configured_parser or detect_family(template_source)) if native else "generic"
    calling = bool(request.tools) and request.tool_choice.mode != "none"
    if not calling:
        # Earlier calls and results are still shown, in the form the template can render.
        grammar = output_grammar(request.output) if request.output is not None else None
        return ChatPlan(template_messages(request.messages, generic=not native), None, grammar, None, live=False)
    grammar = chat_grammar(
        request.tools,
        request.tool_choice,
        family,
        parallel=request.parallel_tool_calls,
        output=request.output,
        constrain_auto=constrain_auto,
    )
    live = grammar is not None
    if not native:
        messages = with_generic_tools(request.messages, request.tools)
        return ChatPlan(messages, None, grammar, family, live)
    messages = template_messages(request.messages, generic=False)
    return ChatPlan(messages, template_tools(request.tools), grammar, family, live)


def template_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": _function(tool)} for tool in tools]


def template_messages(messages: Sequence[ChatMessage], *, generic: bool) -> list[dict[str, Any]]:
    """Messages as chat templates expect them. Calls carry their arguments as objects (the
    templates serialise them). With `generic`, calls and results become plain text in the
    generic format, for templates that know no `tool_calls` or `tool` role."""
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    rendered = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": _content(message)}
        if message.name:
            item["name"] = message.name
        if message.tool_calls and generic:
            calls = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in message.tool_calls]
            item["content"] = (message.content + "\n" if message.content else "") + json.dumps({"tool_calls": calls})
        elif message.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                for c in message.tool_calls
            ]
        if message.role == "tool" and generic:
            result = {"tool_call_id": message.tool_call_id, "name": names.get(message.tool_call_id or ""),
                      "content": message.content}  # fmt: skip
            item = {"role": "user", "content": json.dumps({"tool_response": result})}
        elif message.role == "tool":
            item["tool_call_id"] = message.tool_call_id
            item["name"] = names.get(message.tool_call_id or "", "")
        rendered.append(item)
    return rendered


def with_generic_tools(messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The generic format: the tools described at the end of the system message (one is
    added when there is none), calls and results as text."""
    rendered = template_messages(messages, generic=True)
    described = "\n".join(json.dumps(_function(tool)) for tool in tools)
    instructions = GENERIC_INSTRUCTIONS.format(tools=described)
    if rendered and rendered[0]["role"] == "system":
        rendered[0] = {**rendered[0], "content": f"{rendered[0]['content']}\n\n{instructions}"}
    else:
        rendered.insert(0, {"role": "system", "content": instructions})
    return rendered


def _content(message: ChatMessage) -> Any:
    """Text, or for a message with images or videos the parts in order, as vision models'
    templates (and processors) take them: `{"type": "image"}` where each image goes,
    `{"type": "video"}` where each video does."""
    if not message.parts:
        return message.content
    return [{"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": _media_type(p)}
            for p in message.parts]  # fmt: skip


def _media_type(part: ContentPart) -> str:
    return "video" if isinstance(part, VideoInput) else "image"


def _function(tool: Tool) -> dict[str, Any]:
    described: dict[str, Any] = {"name": tool.name}
    if tool.description:
        described["description"] = tool.description
    described["parameters"] = dict(tool.parameters)
    return described


def _arguments(text: str) -> Any:
    """A call's arguments as an object for the template; text that is not JSON stays text."""
    try:
        return json.loads(text)
    except ValueError:
        return text
