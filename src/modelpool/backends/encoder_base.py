"""What the two sentence-transformers backends share (`sentence_transformers` embeddings
and `cross_encoder` rerankers): an engine thread and a tokenizer thread, the memory
estimate, stopping, and the model's Hugging Face tokenizer for /tokenize and /detokenize."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends import hf_tokens
from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.threads import EngineThread
from modelpool.backends.tokenizer_access import TokenizerAccess
from modelpool.backends.torch_device import estimate_on
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import ChatRequest, TokenPiece


class EncoderOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    device: str = "cpu"
    """torch device: cpu, cuda, cuda:N, mps, or auto (CUDA, then MPS, then CPU)."""
    batch_size: int = Field(default=32, ge=1)
    """Inputs (texts, or pairs for a reranker) per forward pass."""
    trust_remote_code: bool = False
    """Allow custom model code shipped with the weights."""


class EncoderBackend(DeclaredBackend):
    purpose: ClassVar[str]
    """What the model does, for the error a chat tokenization gets ("embeds text")."""

    def __init__(self, model: ModelConfig, options: Any, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self._thread = EngineThread(model.id)
        # Tokenizing on its own thread lets requests be prepared while a batch computes (the
        # tokenizer is not thread-safe: one user at a time, that thread or, for a small
        # request while it is free, the event loop).
        self._tokenizing = TokenizerAccess(f"{model.id}-tokenizer")
        self._engine: Any = None
        """The loaded SentenceTransformer or CrossEncoder."""
        self._concurrent_batches = 1
        """Batches the engine computes at once (its compute lanes, once started)."""

    async def estimate_memory(self) -> MemoryEstimate:
        """Weights plus PyTorch's working memory, before loading (replaced by a measurement after)."""
        path = await locate(self.model, self.hub)
        weights = sum(files_size(p) for p in path.rglob("*") if p.suffix in {".safetensors", ".bin", ".pt"})
        return estimate_on(self.options.device, int(weights * 1.5) + 64 * 1024 * 1024, host_bytes=64 * 1024 * 1024)

    async def stop(self) -> None:
        self._engine = None
        await asyncio.to_thread(self._thread.shutdown)
        await asyncio.to_thread(self._tokenizing.shutdown)

    def concurrent_batches(self) -> int:
        return self._concurrent_batches

    async def check_health(self) -> None:
        self._loaded()

    # ----- tokenizer (POST /tokenize, /detokenize) -------------------------------------

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        tokenizer = self._loaded().tokenizer
        return await self._tokenizing.call(hf_tokens.encode, tokenizer, text, add_special_tokens)

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        raise InvalidRequest(
            f"model '{self.model.id}' {self.purpose} and has no chat template; send `prompt` instead", param="messages"
        )

    async def decode_tokens(self, ids: list[int]) -> str:
        return await self._tokenizing.call(hf_tokens.decode, self._loaded().tokenizer, ids)

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return await self._tokenizing.call(hf_tokens.pieces, self._loaded().tokenizer, ids)

    async def max_model_len(self) -> int | None:
        limit = self._loaded().max_seq_length
        return int(limit) if limit else None

    def _loaded(self) -> Any:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._engine
