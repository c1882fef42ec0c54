"""CrossEncoderBackend: rerankers in the sentence-transformers `CrossEncoder` format
(ms-marco-MiniLM, bge-reranker, ...): one relevance score per (query, document) pair.

Pairs are encoded on a tokenizer thread as the model's own `preprocess` encodes them, so a
score here equals `CrossEncoder.predict`; the runtime batches pairs of concurrent requests
into one forward pass (`score_encoded`), as it does for embeddings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from modelpool.backends.context import BackendContext
from modelpool.backends.encoder_base import EncoderBackend, EncoderOptions
from modelpool.backends.requirements import require_engine
from modelpool.backends.torch_device import pick_device
from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from modelpool.capabilities import Capabilities
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import locate
from modelpool.errors import ContextLengthExceeded, ModelLoadFailed
from modelpool.inference import EncodedPair, PairScoreRequest
from modelpool.tasks import Task

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder


class CrossEncoderOptions(EncoderOptions):
    max_length: int | None = Field(default=None, ge=8)
    """Override the model's maximum pair length in tokens."""
    activation: Literal["model", "sigmoid", "identity"] = "model"
    """Applied to the logit: the model's own choice (saved with it; sigmoid when it names
    none), sigmoid (scores in 0..1), or identity (raw logits)."""


class CrossEncoderBackend(EncoderBackend):
    Options = CrossEncoderOptions
    capabilities = Capabilities(tasks=frozenset({Task.RERANK}), streaming=False, tokenizer=True)
    overridable = frozenset({"device", "batch_size", "max_length"})
    purpose = "scores text pairs"

    def __init__(self, model: ModelConfig, options: CrossEncoderOptions, context: BackendContext) -> None:
        super().__init__(model, options, context)
        self.options: CrossEncoderOptions = options

    async def start(self) -> None:
        require_engine(self.model.id, ("sentence_transformers",), "rerank")
        _require_modular_cross_encoder(self.model.id)
        path = await locate(self.model, self.hub)
        self._engine = await self._thread.call(self._load, str(path))

    async def warmup(self) -> None:
        await self.score_encoded(await self.prepare_pairs(PairScoreRequest((("warm", "up"),))))

    async def prepare_pairs(self, request: PairScoreRequest) -> list[EncodedPair]:
        ce = self._require_model()
        return await self._tokenizing.call(self._prepare, ce, request)

    async def score_encoded(self, pairs: list[EncodedPair]) -> npt.NDArray[np.float32]:
        ce = self._require_model()
        return await self._thread.call(self._score, ce, pairs)

    def _load(self, path: str) -> CrossEncoder:
        from sentence_transformers import CrossEncoder

        try:
            with MODEL_CONSTRUCTION:
                ce: CrossEncoder = CrossEncoder(
                    path,
                    device=pick_device(self.options.device),
                    trust_remote_code=self.options.trust_remote_code,
                    local_files_only=True,
                    max_length=self.options.max_length,
                )
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadFailed(
                f"model '{self.model.id}': sentence-transformers could not load {path}: {exc}"
            ) from exc
        if ce.num_labels != 1:
            raise ModelLoadFailed(
                f"model '{self.model.id}' has {ce.num_labels} output labels; a reranker gives one score per pair "
                "(a classifier such as an NLI model is not a reranker)"
            )
        ce.eval()
        return ce

    def _prepare(self, ce: CrossEncoder, request: PairScoreRequest) -> list[EncodedPair]:
        """Each pair encoded exactly as `CrossEncoder.predict` encodes it, after checking its
        untruncated length (the model's own encoding truncates silently)."""
        limit = ce.max_seq_length
        pairs = [list(pair) for pair in request.pairs]
        if limit is not None and not request.truncate:
            whole = ce.tokenizer(pairs, truncation=False, verbose=False)["input_ids"]
            for index, ids in enumerate(whole):
                if len(ids) > limit:
                    raise ContextLengthExceeded(
                        f"pair {index} is {len(ids)} tokens; model '{self.model.id}' takes at most {limit} "
                        "(send truncate=true to cut it)",
                        param=request.param(index),
                    )
        features = ce.preprocess(pairs)
        mask = features["attention_mask"].bool()
        encoded = []
        for row in range(len(pairs)):
            keep = mask[row]  # drop the padding the batch encoding added, on whichever side
            encoded.append(EncodedPair({name: tuple(values[row][keep].tolist()) for name, values in features.items()
                                        if hasattr(values, "shape") and values.ndim == 2}))  # fmt: skip
        return encoded

    def _score(self, ce: CrossEncoder, pairs: list[EncodedPair]) -> npt.NDArray[np.float32]:
        """Forward passes over batches of similar length (less padding), scores back in order."""
        import torch

        activation = _activation(ce, self.options.activation)
        pad = ce.tokenizer.pad_token_id or 0
        left = ce.tokenizer.padding_side == "left"  # padded as the model's own batches are
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]))
        scores = np.empty(len(pairs), dtype=np.float32)
        for start in range(0, len(order), self.options.batch_size):
            picked = order[start : start + self.options.batch_size]
            width = max(len(pairs[i]) for i in picked)
            features: dict[str, Any] = {}
            for name in pairs[picked[0]].features:
                fill = pad if name == "input_ids" else 0
                rows = [_padded(pairs[i].features[name], fill, width, left) for i in picked]
                features[name] = torch.tensor(rows, device=ce.device)
            with torch.inference_mode():
                logits = ce(features)["scores"].float()
                out = activation(logits) if activation is not None else logits
            scores[picked] = out.reshape(len(picked), -1)[:, 0].cpu().numpy()
        return scores

    def _require_model(self) -> CrossEncoder:
        ce: CrossEncoder = self._loaded()
        return ce


def _require_modular_cross_encoder(model_id: str) -> None:
    """Encoding pairs as `predict` does needs the modular CrossEncoder (`preprocess`, a
    forward giving `scores`) of sentence-transformers 6; older ones fail mid-request."""
    from sentence_transformers import CrossEncoder, __version__

    if not hasattr(CrossEncoder, "preprocess"):
        raise ModelLoadFailed(
            f"model '{model_id}': the cross_encoder backend needs sentence-transformers>=6 (installed: {__version__}); "
            "pip install -U 'sentence-transformers>=6'"
        )


def _padded(values: tuple[int, ...], fill: int, width: int, left: bool) -> list[int]:
    padding = [fill] * (width - len(values))
    return [*padding, *values] if left else [*values, *padding]


def _activation(ce: CrossEncoder, choice: str) -> Any:
    import torch

    if choice == "sigmoid":
        return torch.sigmoid
    if choice == "identity":
        return None
    return ce.activation_fn
