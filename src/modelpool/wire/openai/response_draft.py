"""The Responses API's wire shapes: the response object, its output items and stream events."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from modelpool.inference import ChatRequest, ToolCall, Usage
from modelpool.pool_api.generation import Generation
from modelpool.wire.openai.responses import FunctionTool, ResponsesBody
from modelpool.wire.openai.upstream import response_format_json


@dataclass
class CallItem:
    """A `function_call` output item as it is built."""

    id: str
    call_id: str
    name: str
    arguments: str = ""

    def json(self, status: str) -> dict[str, Any]:
        return {"id": self.id, "type": "function_call", "status": status, "call_id": self.call_id,
                "name": self.name, "arguments": self.arguments}  # fmt: skip

    def call(self) -> ToolCall:
        return ToolCall(self.call_id, self.name, self.arguments)


@dataclass
class ResponseDraft:
    """One response as it is built: ids, the request's echoed settings, the text and calls so far."""

    body: ResponsesBody
    chat: ChatRequest
    model: str
    created_at: int
    id: str = field(default_factory=lambda: f"resp_{secrets.token_hex(16)}")
    message_id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(16)}")
    text: str = ""
    reasoning: str = ""
    calls: list[CallItem] = field(default_factory=list)
    sequence: int = 0

    def add_call(self, call_id: str, name: str) -> CallItem:
        item = CallItem(f"fc_{secrets.token_hex(16)}", call_id, name)
        self.calls.append(item)
        return item

    @property
    def has_message(self) -> bool:
        """A reply that only calls has no message item; any other reply has one."""
        return bool(self.text) or not self.calls

    def take(self, generation: Generation) -> None:
        """A whole answer's text, reasoning and calls (the non-streamed reply)."""
        self.text, self.reasoning = generation.text, generation.reasoning
        for call in generation.tool_calls:
            self.add_call(call.id, call.name).arguments = call.arguments

    def message(self, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [self.part()]
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def output(self, status: str) -> list[dict[str, Any]]:
        if status == "in_progress":
            return []
        item_status = "incomplete" if status == "incomplete" else "completed"
        output: list[dict[str, Any]] = []
        if self.reasoning:  # models with a reasoning parser: their thinking comes first
            output.append({
                "id": f"rs_{self.message_id[4:]}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": self.reasoning}],
                "status": "completed",
            })  # fmt: skip
        if self.has_message:
            output.append(self.message(item_status))
        output += [call.json(item_status) for call in self.calls]
        return output

    def response(
        self, status: str, usage: Usage | None = None, finish_reason: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        body, chat = self.body, self.chat
        incomplete = status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": self.output(status),
            "parallel_tool_calls": chat.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store,
            "temperature": body.temperature,
            "text": {"format": _format_json(chat)},
            "tool_choice": _choice_json(chat),
            "tools": [_tool_json(tool) for tool in body.tools or []],
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": usage_json(usage) if usage is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
            # llm-pool's field (and the property OpenAI's SDKs compute from `output`): the answer's text
            "output_text": self.text if status != "in_progress" else "",
            **extra,
        }

    def event(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def _format_json(chat: ChatRequest) -> dict[str, Any]:
    if chat.output is None:
        return {"type": "text"}
    wire = response_format_json(chat.output)
    if wire["type"] == "json_schema":  # the Responses API's flat shape
        return {"type": "json_schema", **wire["json_schema"]}
    return wire


def _choice_json(chat: ChatRequest) -> Any:
    choice = chat.tool_choice
    return {"type": "function", "name": choice.name} if choice.mode == "function" else choice.mode


def _tool_json(tool: FunctionTool) -> dict[str, Any]:
    return tool.model_dump(mode="json", exclude_none=True)
