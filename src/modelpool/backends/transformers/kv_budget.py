"""The most memory a transformers model's batch KV cache may take, known before it loads.

The engine keeps the batch's cache within `max_batch_tokens` token places (rows × the widest
row, see engine.py); a lone row may pass that, up to the longest context. `SpareCache`'s
buffers hold up to a quarter more columns (16 to 256 a row, kv_cache.py), a prompt group's
own cache (at most `prefill_chunk` places) exists before it joins, and a buffer being
re-allocated exists twice for one layer. The bound counts all of that, so the pool can
count a model's KV cache from its load on rather than finding it when the batch is full:
SmolLM2-135M in float32 takes 45 KiB a token place, 1.8 GiB at the default 32,768 places.
"""

from __future__ import annotations

import json
from pathlib import Path

from modelpool.backends.gpu_estimates import GgufShape, gguf_shape
from modelpool.backends.transformers.engine import BatchLimits


def kv_shape(path: Path) -> GgufShape | None:
    """Layers, KV heads and head sizes from a model folder's config.json (a vision model's
    text config) or a GGUF's header; None when neither says."""
    if path.suffix == ".gguf" and path.is_file():
        return gguf_shape(path)
    config = path / "config.json"
    if not config.is_file():
        return None
    try:
        fields = json.loads(config.read_text("utf-8"))
        text = fields.get("text_config") or fields
        layers, hidden = int(text["num_hidden_layers"]), int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head = int(text.get("head_dim") or hidden // heads)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return None
    return GgufShape(layers, kv_heads, head, head)


def place_bytes(shape: GgufShape, dtype_bytes: int) -> int:
    """One token place of the cache: every layer's key and value."""
    return shape.layers * shape.kv_heads * (shape.key_length + shape.value_length) * dtype_bytes


def batch_kv_bytes(shape: GgufShape, dtype_bytes: int, limits: BatchLimits, longest_context: int) -> int:
    """The most the batch's cache (and a prompt group's, before it joins) holds at once."""
    # kv_cache imports transformers: not at this module's import (the backend's is light).
    from modelpool.backends.transformers.kv_cache import MAX_SPARE, MIN_SPARE

    places = max(limits.max_batch_tokens, longest_context)
    spare = min(places // 4, limits.max_batch_size * MAX_SPARE) + limits.max_batch_size * MIN_SPARE
    held = places + spare + limits.prefill_chunk
    return place_bytes(shape, dtype_bytes) * (held + -(-held // max(1, shape.layers)))
