"""The reranker role: a query and documents in, the documents best first out. Served by a
cross-encoder (`backend: cross_encoder`), or by any embedding model (cosine), so an
embedder's preset works here too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from modelpool.client.base import RoleClient
from modelpool.client.presets import Role
from modelpool.client.results import Reranking, reranking, scores


class RerankerClient(RoleClient):
    kind: ClassVar[Role] = Role.RERANKER
    also: ClassVar[tuple[Role, ...]] = (Role.EMBEDDER,)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str | Mapping[str, Any]],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Reranking:
        """Documents (strings, or objects with a `text`) ranked for `query`, best first."""
        fields = {"query": query, "documents": list(documents), "top_n": top_n, "return_documents": return_documents}
        return reranking(await self._transport.post_json("/v1/rerank", self._body(fields, extra_body)))

    async def score(
        self, text_1: str | Sequence[str], text_2: str | Sequence[str], *, extra_body: Mapping[str, Any] | None = None
    ) -> list[float]:
        """Relevance of `text_1` to each of `text_2` (or pairwise, for two lists of one length)."""
        fields = {"text_1": _listed(text_1), "text_2": _listed(text_2)}
        return scores(await self._transport.post_json("/v1/score", self._body(fields, extra_body)))


def _listed(texts: str | Sequence[str]) -> str | list[str]:
    return texts if isinstance(texts, str) else list(texts)
