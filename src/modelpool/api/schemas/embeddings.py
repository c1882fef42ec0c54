"""POST /v1/embeddings request body."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from modelpool.api.schemas.common import PoolFields, Text
from modelpool.inference import EmbeddingRequest

EmbeddingInput = Text | list[Text] | list[int] | list[list[int]]
MAX_INPUTS = 2048


class EmbeddingsBody(PoolFields):
    model: str = Field(min_length=1)
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate: bool = False
    """modelpool extension: cut over-long inputs to the model's limit instead of a 400."""

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: EmbeddingInput) -> EmbeddingInput:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("input must not be empty")
        if len(items) > MAX_INPUTS and not isinstance(items[0], int):
            raise ValueError(f"at most {MAX_INPUTS} inputs per request")
        for item in items:
            if isinstance(item, str | list) and len(item) == 0:
                raise ValueError("input must not contain empty strings or empty token lists")
        return value

    def to_request(self) -> EmbeddingRequest:
        value = self.input
        if isinstance(value, str):
            inputs: tuple[str | tuple[int, ...], ...] = (value,)
        elif isinstance(value[0], int):
            inputs = (tuple(value),)
        else:
            inputs = tuple(v if isinstance(v, str) else tuple(v) for v in value)
        return EmbeddingRequest(inputs, truncate=self.truncate)
