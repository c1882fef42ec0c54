"""OpenAI response shapes shared by the generation routes."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from modelpool.inference import TokenLogprob, Usage


@dataclass(frozen=True)
class ResponseMeta:
    """id/created/model of one response, shared by all its stream chunks."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseMeta:
        return cls(id=f"{prefix}-{secrets.token_hex(12)}", model=model)


def envelope(meta: ResponseMeta, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """id/object/created/model/choices, then whatever else this response carries
    (`usage`, which may be an explicit null on stream chunks, `metrics`)."""
    body: dict[str, Any] = {"id": meta.id, "object": obj, "created": meta.created, "model": meta.model}
    body["choices"] = choices
    body.update(extra)
    return body


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def chat_logprobs_json(logprobs: tuple[TokenLogprob, ...]) -> dict[str, Any]:
    """Chat style: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": lp.logprob,
                "bytes": list(lp.bytes),
                "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)} for t in lp.top],
            }
            for lp in logprobs
        ]
    }


def completion_logprobs_json(logprobs: tuple[TokenLogprob, ...], text_start: int) -> dict[str, Any]:
    """Legacy completions style: parallel lists, top alternatives as {token: logprob}."""
    offsets, position = [], text_start
    for lp in logprobs:
        offsets.append(position)
        position += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [None if lp.logprob is None else {t.token: t.logprob for t in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }
