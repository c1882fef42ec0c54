"""An integer field takes a whole float (`2.0`) as that integer: JSON and JSON Schema do
not tell them apart, so the published OpenAPI's `integer` admits both (schemathesis sends
both). Anything else stays as strict as it was."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from modelpool.wire.admin import LoadBody
from modelpool.wire.openai.chat import ChatCompletionBody
from modelpool.wire.openai.embeddings import EmbeddingsBody

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_whole_floats_are_integers_and_floats_stay_floats() -> None:
    body = ChatCompletionBody.model_validate({**CHAT, "max_tokens": 5.0, "seed": -3.0, "temperature": 1})
    assert (body.max_tokens, body.seed) == (5, -3) and type(body.max_tokens) is int
    assert body.temperature == 1.0 and type(body.temperature) is float
    assert LoadBody.model_validate({"replicas": 2.0}).replicas == 2
    tokens = EmbeddingsBody.model_validate({"model": "m", "input": [[1.0, 2.0], [3.0]]}).input
    assert tokens == [[1, 2], [3]] and all(type(t) is int for row in tokens for t in row)  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [5.5, True, "5", 2.0**60, float("inf")])
def test_anything_else_is_refused_as_before(value: object) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionBody.model_validate({**CHAT, "max_tokens": value})
