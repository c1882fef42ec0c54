"""Request bodies of rerank (Cohere's and Jina's shape: a query and its documents) and score
(vLLM's: text_1 against text_2, 1:1, 1:N or N:N), and their replies."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from modelpool.inference import PairScoreRequest, PairScores
from modelpool.wire.common import PoolFields, Text
from modelpool.wire.openai.render import ResponseMeta

MAX_DOCUMENTS = 1000


class DocumentObject(BaseModel):
    """`{"text": ...}` with any fields of the client's own (returned as sent)."""

    model_config = ConfigDict(extra="allow", strict=True)
    text: Text


class RerankBody(PoolFields):
    model: str | None = Field(default=None, min_length=1)
    """None (llama-server's `/reranking` bodies may name none): the server's default reranker
    (`defaults.models.rerank`), or the only one."""
    query: Text = Field(min_length=1)
    documents: list[Text | DocumentObject] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: int | None = Field(default=None, ge=0)
    """Return the best this many (None or 0: all, as vLLM reads 0)."""
    return_documents: bool = True
    """Echo each result's document (`{"text": ...}`, or the object as sent), as Jina and vLLM
    do; Cohere's clients send false when they do not want them."""
    truncate: bool = True
    """Cut a pair longer than the model takes (documents are often long); false: a 400."""

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def document(self, index: int) -> dict[str, Any]:
        found = self.documents[index]
        return {"text": found} if isinstance(found, str) else found.model_dump()

    def to_request(self) -> PairScoreRequest:
        pairs = tuple((self.query, text) for text in self.texts())
        params = tuple(("query", f"documents[{i}]") for i in range(len(pairs)))
        return PairScoreRequest(pairs, truncate=self.truncate, params=params)


class ScoreBody(PoolFields):
    model: str = Field(min_length=1)
    text_1: Text | list[Text] = Field(json_schema_extra={"minItems": 1, "maxItems": MAX_DOCUMENTS})
    text_2: Text | list[Text] = Field(json_schema_extra={"minItems": 1, "maxItems": MAX_DOCUMENTS})
    truncate: bool = True
    """Cut a pair longer than the model takes; false: a 400."""

    @model_validator(mode="after")
    def _lengths_pair_up(self) -> ScoreBody:
        first, second = self._lists()
        if not first or not second:
            raise ValueError("text_1 and text_2 must not be empty")
        if len(first) > 1 and len(first) != len(second):
            raise ValueError(f"text_1 has {len(first)} texts and text_2 {len(second)}: pair them 1:1, 1:N or N:N")
        if len(second) > MAX_DOCUMENTS:
            raise ValueError(f"at most {MAX_DOCUMENTS} pairs per request")
        return self

    def _lists(self) -> tuple[list[str], list[str]]:
        return _listed(self.text_1), _listed(self.text_2)

    def to_request(self) -> PairScoreRequest:
        first, second = self._lists()
        one = len(first) == 1  # 1:N pairs the one text_1 with each text_2
        pairs = tuple((first[0] if one else first[i], text) for i, text in enumerate(second))
        params = tuple(
            (_field("text_1", self.text_1, 0 if one else i), _field("text_2", self.text_2, i))
            for i in range(len(pairs))
        )
        return PairScoreRequest(pairs, truncate=self.truncate, params=params)


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def _field(name: str, value: str | list[str], index: int) -> str:
    """`text_1` for a single text, `text_1[i]` for one of a list."""
    return name if isinstance(value, str) else f"{name}[{index}]"


def rerank_json(body: RerankBody, scored: PairScores, model_id: str) -> dict[str, Any]:
    """The documents best first (the top_n of them), each with its score and, if asked, itself."""
    ranked = sorted(range(len(scored.scores)), key=lambda i: -scored.scores[i])  # stable: ties keep input order
    ranked = ranked[: body.top_n] if body.top_n else ranked
    results = []
    for index in ranked:
        result: dict[str, Any] = {"index": index, "relevance_score": scored.scores[index]}
        if body.return_documents:
            result["document"] = body.document(index)
        results.append(result)
    meta = ResponseMeta.new("rerank", model_id)
    usage = {"prompt_tokens": scored.prompt_tokens, "total_tokens": scored.prompt_tokens}
    return {"id": meta.id, "model": meta.model, "results": results, "usage": usage}


def score_json(scored: PairScores, model_id: str) -> dict[str, Any]:
    """vLLM's list of scores, one per pair in order."""
    meta = ResponseMeta.new("score", model_id)
    data = [{"index": i, "object": "score", "score": value} for i, value in enumerate(scored.scores)]
    usage = {"prompt_tokens": scored.prompt_tokens, "total_tokens": scored.prompt_tokens, "completion_tokens": 0}
    return {"id": meta.id, "object": "list", "created": meta.created, "model": meta.model, "data": data,
            "usage": usage}  # fmt: skip
