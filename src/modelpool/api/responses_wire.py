"""The Responses API's wire shapes: the response object and its stream events."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from modelpool.api.schemas.responses import ResponsesBody
from modelpool.inference import Usage


@dataclass
class ResponseDraft:
    """One response as it is built: ids, the request's echoed settings, and the text so far."""

    body: ResponsesBody
    model: str
    created_at: int
    id: str = field(default_factory=lambda: f"resp_{secrets.token_hex(16)}")
    message_id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(16)}")
    text: str = ""
    reasoning: str = ""
    sequence: int = 0

    def message(self, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [self.part()]
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def response(
        self, status: str, usage: Usage | None = None, finish_reason: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        body = self.body
        incomplete = status == "incomplete"
        output = [] if status == "in_progress" else [self.message("incomplete" if incomplete else "completed")]
        if self.reasoning and output:  # models with a reasoning parser: their thinking comes first
            reasoning = {
                "id": f"rs_{self.message_id[4:]}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": self.reasoning}],
                "status": "completed",
            }
            output.insert(0, reasoning)
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
            "output": output,
            "parallel_tool_calls": False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store,
            "temperature": body.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": usage_json(usage) if usage is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
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
