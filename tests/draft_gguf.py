"""Draft models for speculative decoding tests: a tiny Llama with random weights and
SmolLM2's own tokenizer (every metadata key copied from the real GGUF, the architecture
shrunk), and the same with one token respelled (a vocabulary the model does not share).
Written once into the test cache (gguf-py's GGUFWriter), reused by later sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.hub_repos import smollm2_gguf
from tests.vlm_models import _cached, default_cache_dir

BUILD_VERSION = 1
EMBED, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 1
RESPELLED_TOKEN = 1000


def random_draft_gguf(cache_dir: Path | None = None) -> Path:
    folder = _cached(cache_dir or default_cache_dir(), f"random-draft-v{BUILD_VERSION}", lambda f: _write(f, False))
    return folder / "draft.gguf"


def foreign_vocab_gguf(cache_dir: Path | None = None) -> Path:
    folder = _cached(cache_dir or default_cache_dir(), f"foreign-draft-v{BUILD_VERSION}", lambda f: _write(f, True))
    return folder / "draft.gguf"


_SHRUNK = {
    "llama.block_count": LAYERS,
    "llama.embedding_length": EMBED,
    "llama.feed_forward_length": FFN,
    "llama.attention.head_count": HEADS,
    "llama.attention.head_count_kv": KV_HEADS,
    "llama.rope.dimension_count": EMBED // HEADS,
    "general.file_type": 1,  # mostly f16
}


def _write(folder: Path, respell: bool) -> None:
    import gguf

    reader = gguf.GGUFReader(smollm2_gguf())
    writer = gguf.GGUFWriter(folder / "draft.gguf", "llama")
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        value = field.contents()
        if field.name in _SHRUNK:
            value = _SHRUNK[field.name]
        elif respell and field.name == gguf.Keys.Tokenizer.LIST:
            value = list(value)
            value[RESPELLED_TOKEN] = "zzqx"
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    n_vocab = len(reader.fields[gguf.Keys.Tokenizer.LIST].contents())
    for name, array in _tensors(n_vocab).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tensors(n_vocab: int) -> dict[str, np.ndarray]:
    """Random weights in numpy's order (ggml's dimensions reversed); the output layer is tied
    to the embeddings. Scaled so that the draft's guesses are confident yet mostly wrong."""
    rng = np.random.default_rng(7)
    kv = EMBED // HEADS * KV_HEADS

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    tensors = {"token_embd.weight": weight(n_vocab, EMBED, scale=1.0), "output_norm.weight": np.ones(EMBED, np.float32)}
    for layer in range(LAYERS):
        tensors |= {
            f"blk.{layer}.attn_norm.weight": np.ones(EMBED, np.float32),
            f"blk.{layer}.attn_q.weight": weight(EMBED, EMBED),
            f"blk.{layer}.attn_k.weight": weight(kv, EMBED),
            f"blk.{layer}.attn_v.weight": weight(kv, EMBED),
            f"blk.{layer}.attn_output.weight": weight(EMBED, EMBED),
            f"blk.{layer}.ffn_norm.weight": np.ones(EMBED, np.float32),
            f"blk.{layer}.ffn_gate.weight": weight(FFN, EMBED),
            f"blk.{layer}.ffn_up.weight": weight(FFN, EMBED),
            f"blk.{layer}.ffn_down.weight": weight(EMBED, FFN),
        }
    return tensors
