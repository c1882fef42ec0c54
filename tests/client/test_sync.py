"""The synchronous facade (modelpool.client.sync) against the real modelpool server."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from modelpool.client import ChatMessage, ModelNotFound, ModelsConfig, load_models_config, sync
from tests.client.conftest import ENVIRON, keyed, write_models_yaml
from tests.processes import Server

pytestmark = pytest.mark.e2e
HELLO = [ChatMessage.user("Name three colors.")]


@pytest.fixture
def config(pool_server: Server, tmp_path: Path) -> ModelsConfig:
    roles = {
        "llm": keyed(pool_server.url, "preset:smollm2"),
        "search": keyed(pool_server.url, "preset:minilm"),
        "missing": keyed(pool_server.url, "preset:smollm2", model_name="no-such-model"),
    }
    return load_models_config(write_models_yaml(tmp_path, roles), environ=ENVIRON)


def test_sync_chat_stream_embed_and_rerank(config: ModelsConfig) -> None:
    with (
        sync.make_llm(config, "llm") as llm,
        sync.make_embedder(config, "search") as embedder,
        sync.make_reranker(config, "search") as reranker,
    ):
        llm.wait_ready(30)
        reply = llm.chat(HELLO, max_tokens=16, temperature=0)
        deltas = list(llm.stream_chat(HELLO, max_tokens=16, temperature=0))
        vectors = embedder.embed(["a cat", "a dog"]).vectors
        ranked = reranker.rerank("a kitten", ["tax law", "a small cat"])
        scores = reranker.score("a kitten", ["tax law", "a small cat"])
    assert reply.content and "".join(d.content for d in deltas) == reply.content
    assert deltas[-1].usage == reply.usage
    assert len(vectors) == 2 and len(vectors[0]) == 384
    assert ranked.order == [1, 0] and scores[1] > scores[0]


def test_sync_stream_left_early_and_typed_errors(config: ModelsConfig) -> None:
    with sync.make_llm(config, "llm") as llm:
        whole = llm.chat(HELLO, max_tokens=16, temperature=0)
        stream = llm.stream_chat(HELLO, max_tokens=16, temperature=0)
        first = next(d for d in stream if d.content)  # the first text (a role-only delta comes before)
        assert isinstance(stream, Generator)  # typed as an Iterator; a generator, which closes
        stream.close()  # closes the HTTP stream; the client stays usable
        assert whole.content.startswith(first.content)  # greedy: the answer's own beginning
        assert llm.chat(HELLO, max_tokens=4, extra_body={"min_tokens": 1}).content  # sampled: ≥ 1 token
    with sync.make_llm(config, "missing") as missing, pytest.raises(ModelNotFound):
        missing.chat(HELLO, max_tokens=4)
