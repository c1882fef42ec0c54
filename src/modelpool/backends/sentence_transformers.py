"""SentenceTransformersBackend: embedding models in the sentence-transformers format."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from modelpool.backends.context import BackendContext
from modelpool.backends.encoder_base import EncoderBackend, EncoderOptions
from modelpool.backends.lanes import ComputeLanes, auto_lanes
from modelpool.backends.requirements import require_engine
from modelpool.backends.threads import in_passing_thread
from modelpool.backends.torch_device import pick_device
from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from modelpool.capabilities import Capabilities
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import locate
from modelpool.errors import ContextLengthExceeded, InvalidRequest, ModelLoadFailed
from modelpool.inference import EmbeddingRequest, EmbeddingResult
from modelpool.tasks import Task

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from modelpool.backends.traced_encoder import TracedEncoder

log = logging.getLogger("modelpool.backends")


class SentenceTransformersOptions(EncoderOptions):
    normalize: bool = False
    """L2-normalise even when the model's own pipeline has no Normalize step."""
    max_seq_length: int | None = Field(default=None, ge=1)
    """Override the model's maximum input length in tokens."""
    lanes: int = Field(default=0, ge=0, le=64)
    """Slices of a batch computed at once, each on its own thread with its share of PyTorch's
    CPU threads (backends/lanes.py says why). 0: two on a CPU with two threads or more, else one."""
    trace: bool = True
    """On a CPU, trace the transformer to TorchScript at load and use it when it encodes
    probes as the eager forward does (backends/traced_encoder.py: its forward runs without
    the GIL; one-sentence requests measured 1.3-1.5x the requests/s). false: always the eager
    forward."""


LANE_ROWS = 4
"""A batch is split only into slices of at least this many inputs."""
BUSY_LANE_ROWS = 16
"""... and of at least this many when it waited for a lane (ComputeLanes.map says why).
Measured for all-MiniLM-L6-v2 on one thread: 3.0 ms a row in slices of 16, 3.3-4.0 in
slices of 8, 5.5 in slices of 2 (the weights are read once a slice)."""


class SentenceTransformersBackend(EncoderBackend):
    Options = SentenceTransformersOptions
    capabilities = Capabilities(tasks=frozenset({Task.EMBEDDING}), streaming=False, tokenizer=True)
    overridable = frozenset({"device", "batch_size", "max_seq_length"})
    purpose = "embeds text"

    def __init__(self, model: ModelConfig, options: SentenceTransformersOptions, context: BackendContext) -> None:
        super().__init__(model, options, context)
        self.options: SentenceTransformersOptions = options
        self.dimensions = 0
        self._special_wrap: tuple[list[int], list[int]] = ([], [])
        self._lanes: ComputeLanes | None = None
        self._traced: TracedEncoder | None = None

    async def start(self) -> None:
        require_engine(self.model.id, ("sentence_transformers",), "embeddings")
        path = await locate(self.model, self.hub)
        # Built and traced on a thread that ends: with lanes it would hold an idle OpenMP pool
        # for good, which slows every other engine's parallel regions (threads.py).
        st = self._engine = await in_passing_thread(self._load, str(path))
        self._special_wrap = special_tokens_around(st.tokenizer)
        dimension_of = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
        self.dimensions = int(dimension_of() or 0)
        if self.options.trace and st.device.type == "cpu":
            await in_passing_thread(self._trace, st)
        count = auto_lanes(self.options.lanes, st.device.type)
        if count > 1:  # one lane is the engine thread itself
            lanes = ComputeLanes(self.model.id, count)
            await lanes.start()
            self._lanes = lanes
            self._concurrent_batches = count

    async def stop(self) -> None:
        lanes, self._lanes = self._lanes, None
        self._concurrent_batches = 1
        traced, self._traced = self._traced, None
        if traced is not None:
            traced.release()
        if lanes is not None:
            await asyncio.to_thread(lanes.shutdown)
        await super().stop()

    async def warmup(self) -> None:
        prefix, suffix = self._special_wrap
        await self.embed_tokens([[*prefix, *suffix]])

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        ids = await self.prepare(request)
        vectors = await self.embed_tokens(ids)
        counts = tuple(len(i) for i in ids)
        return EmbeddingResult(vectors, sum(counts), counts)

    async def prepare(self, request: EmbeddingRequest) -> list[list[int]]:
        """The token ids of each input, special tokens included, checked against the model's
        limits (a one-sentence request on the event loop: tokenizer_access.py says why)."""
        st = self._require_model()
        return await self._tokenizing.call_small(request.inputs, self._prepare, st, request)

    async def embed_tokens(self, ids: list[list[int]]) -> np.ndarray:
        """Embeddings of prepared token ids, one row each, in order."""
        st = self._require_model()
        lanes = self._lanes
        if lanes is None:
            return await self._thread.call(self._encode_ids, st, ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # each slice: inputs of like length
        parts = await lanes.map(
            lambda part: self._encode_ids(st, [ids[i] for i in part]), order, LANE_ROWS, BUSY_LANE_ROWS
        )
        rows = np.empty_like(parts[0], shape=(len(ids), parts[0].shape[1]))
        rows[order] = np.concatenate(parts)
        return rows

    def _load(self, path: str) -> SentenceTransformer:
        from sentence_transformers import SentenceTransformer

        try:
            with MODEL_CONSTRUCTION:
                st = SentenceTransformer(
                    path,
                    device=pick_device(self.options.device),
                    trust_remote_code=self.options.trust_remote_code,
                    local_files_only=True,
                )
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadFailed(
                f"model '{self.model.id}': sentence-transformers could not load {path}: {exc}"
            ) from exc
        if self.options.max_seq_length:
            st.max_seq_length = self.options.max_seq_length
        st.eval()
        return st

    def _trace(self, st: SentenceTransformer) -> None:
        from modelpool.backends.traced_encoder import trace_encoder

        traced = trace_encoder(st, str(self.model.source))
        if isinstance(traced, str):
            log.info("encoder left eager", extra={"model": self.model.id, "reason": traced})
            return
        self._traced = traced
        log.info("encoder traced to TorchScript", extra={"model": self.model.id})

    def _prepare(self, st: SentenceTransformer, request: EmbeddingRequest) -> list[list[int]]:
        texts = [item for item in request.inputs if isinstance(item, str)]
        encoded = iter(
            st.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"] if texts else []
        )
        prefix, suffix = self._special_wrap
        prepared = []
        for index, item in enumerate(request.inputs):
            if isinstance(item, str):
                ids = list(next(encoded))
            else:
                self._check_vocabulary(st, item, index)
                ids = [*prefix, *item, *suffix]
            prepared.append(self._fit(ids, st.max_seq_length, index, request.truncate))
        return prepared

    def _check_vocabulary(self, st: SentenceTransformer, ids: tuple[int, ...], index: int) -> None:
        size = st.tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{size - 1})", param=f"input[{index}]")

    def _fit(self, ids: list[int], limit: int | None, index: int, truncate: bool) -> list[int]:
        """`ids` within `limit` tokens; a None limit (the model defines no maximum length) keeps them whole."""
        if limit is None or len(ids) <= limit:
            return ids
        if not truncate:
            raise ContextLengthExceeded(
                f"input {index} is {len(ids)} tokens; model '{self.model.id}' takes at most {limit} "
                "(send truncate=true to cut it)",
                param=f"input[{index}]",
            )
        suffix = self._special_wrap[1]
        return ids[: limit - len(suffix)] + suffix

    def _encode_ids(self, st: SentenceTransformer, ids: list[list[int]]) -> np.ndarray:
        """Forward passes in batches of similar length (less padding), rows put back in order."""
        import torch

        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        rows = np.empty((len(ids), self.dimensions or 1), dtype=np.float32)
        pad = st.tokenizer.pad_token_id or 0
        for start in range(0, len(order), self.options.batch_size):
            picked = order[start : start + self.options.batch_size]
            batch = [ids[i] for i in picked]
            width = max(len(i) for i in batch)
            input_ids = torch.tensor([i + [pad] * (width - len(i)) for i in batch], device=st.device)
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in batch], device=st.device)
            features: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask}
            if "token_type_ids" in st.tokenizer.model_input_names:
                features["token_type_ids"] = torch.zeros_like(input_ids)
            traced = self._traced
            with torch.inference_mode():
                embedded = traced(features) if traced is not None else st.forward(features)["sentence_embedding"]
            if self.options.normalize:
                embedded = torch.nn.functional.normalize(embedded, p=2, dim=1)
            vectors = embedded.float().cpu().numpy()
            if rows.shape[1] != vectors.shape[1]:
                rows = np.empty((len(ids), vectors.shape[1]), dtype=np.float32)
            rows[picked] = vectors
        return rows

    def _require_model(self) -> SentenceTransformer:
        st: SentenceTransformer = self._loaded()
        return st


def special_tokens_around(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a text ([CLS] … [SEP] for BERT),
    learnt from the tokenizer itself so that token-id input is wrapped exactly like text."""
    plain = tokenizer("probe", add_special_tokens=False)["input_ids"]
    full = tokenizer("probe", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start]), list(full[start + len(plain) :])
    return [], []
