"""make_llm / make_vlm / make_embedder / make_reranker / make_stt / make_tts: a role of models.yaml → its
async client. A `service:` endpoint is looked up in the registry here, when the client
is made, not when the file is loaded (services start and stop in between)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from modelpool.client.audio import STTClient, TTSClient
from modelpool.client.base import RoleClient
from modelpool.client.config import ModelsConfig, expect_role, load_models_config
from modelpool.client.embedder import EmbedderClient
from modelpool.client.llm import LLMClient, VLMClient
from modelpool.client.reranker import RerankerClient

ConfigLike = ModelsConfig | str | Path
"""A loaded config, or the path of a models.yaml to load."""
C = TypeVar("C", bound=RoleClient)


def make_llm(config: ConfigLike, role: str) -> LLMClient:
    return make_client(LLMClient, config, role)


def make_vlm(config: ConfigLike, role: str) -> VLMClient:
    """Refuses (ConfigError) a role whose capabilities do not include vision."""
    return make_client(VLMClient, config, role)


def make_embedder(config: ConfigLike, role: str) -> EmbedderClient:
    return make_client(EmbedderClient, config, role)


def make_reranker(config: ConfigLike, role: str) -> RerankerClient:
    """A reranker role, or an embedder's (embedding models rerank by cosine)."""
    return make_client(RerankerClient, config, role)


def make_stt(config: ConfigLike, role: str) -> STTClient:
    return make_client(STTClient, config, role)


def make_tts(config: ConfigLike, role: str) -> TTSClient:
    return make_client(TTSClient, config, role)


def make_client(cls: type[C], config: ConfigLike, role: str) -> C:
    loaded = config if isinstance(config, ModelsConfig) else load_models_config(config)
    endpoint = loaded.endpoint(role)
    expect_role(endpoint, cls.kind, cls.also)
    return cls(endpoint, loaded.base_url(role))
