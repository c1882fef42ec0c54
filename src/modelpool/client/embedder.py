"""The embedder role: texts in, one vector per text out, in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from modelpool.client.base import RoleClient
from modelpool.client.presets import Role
from modelpool.client.results import Embeddings, embeddings


class EmbedderClient(RoleClient):
    kind: ClassVar[Role] = Role.EMBEDDER

    async def embed(self, texts: str | Sequence[str], *, extra_body: Mapping[str, Any] | None = None) -> Embeddings:
        """A single string gives one vector (`vectors[0]`)."""
        inputs = [texts] if isinstance(texts, str) else list(texts)
        body = self._body({"input": inputs, "encoding_format": "float"}, extra_body)
        return embeddings(await self._transport.post_json("/v1/embeddings", body))
