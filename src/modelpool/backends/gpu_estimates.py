"""What a model will hold on the GPU, judged from its files and options before it loads:
a GGUF's offloaded share of weights and its KV cache (llama.cpp in process and
llama-server), a safetensors checkpoint's parameters at the dtype it loads in (PyTorch).
A measurement replaces the estimate once the model runs (`runtime/replicas.py`)."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path

from modelpool.backends.llama_knobs import KvCacheType
from modelpool.detect.gguf import GgufHeader, NeedMoreBytes, parse_header
from modelpool.errors import ModelSourceError

MiB = 1024 * 1024
KV_TYPE_BYTES: Mapping[str, float] = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
    "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32,
}  # fmt: skip
"""Bytes per element of llama.cpp's KV-cache types (`type_k`/`type_v`): a quantised block
of 32 values with its scale(s)."""
LLAMA_COMPUTE_BUFFER = 256 * MiB
"""llama.cpp's compute buffer on the GPU when layers are offloaded (a few hundred MB for a
small model; it grows with the batch and the vocabulary)."""
DTYPE_BYTES: Mapping[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
"""safetensors' dtypes → bytes per element."""
_HEADS = (2 * MiB, 16 * MiB, 64 * MiB)


@dataclass(frozen=True)
class GgufShape:
    """What a GGUF says about its attention: enough to size its KV cache."""

    layers: int
    kv_heads: int
    key_length: int
    value_length: int


def gguf_shape(path: Path) -> GgufShape | None:
    """The model's layer count and KV heads from the GGUF's header (None: the file does not
    say, or is no GGUF: the estimate then guesses, the load itself will tell)."""
    try:
        header = _gguf_header(path)
    except (ModelSourceError, OSError):
        return None
    arch = header.text("general.architecture") or ""
    layers, embedding = header.number(f"{arch}.block_count"), header.number(f"{arch}.embedding_length")
    heads = header.number(f"{arch}.attention.head_count")
    if not layers or not embedding or not heads:
        return None
    kv_heads = header.number(f"{arch}.attention.head_count_kv") or heads  # an array (per layer): take MHA
    key = header.number(f"{arch}.attention.key_length") or embedding // heads
    value = header.number(f"{arch}.attention.value_length") or embedding // heads
    return GgufShape(layers, kv_heads, key, value)


def _gguf_header(path: Path) -> GgufHeader:
    with path.open("rb") as file:
        for size in _HEADS:
            file.seek(0)
            head = file.read(size)
            try:
                return parse_header(head, complete=len(head) < size, label=str(path))
            except NeedMoreBytes:
                continue
    raise ModelSourceError(f"{path}: the GGUF metadata is larger than {_HEADS[-1]:,} bytes")


def kv_type_bytes(kv_type: KvCacheType | None) -> float:
    """Bytes per element of a KV-cache type as the options name it (None: f16, llama.cpp's default)."""
    return KV_TYPE_BYTES[kv_type or "f16"]


def kv_cache_bytes(
    shape: GgufShape, tokens: int, type_k: KvCacheType | None = "f16", type_v: KvCacheType | None = "f16"
) -> int:
    """All layers' K and V for `tokens` cached tokens (every parallel sequence's context)."""
    per_layer = shape.kv_heads * (shape.key_length * kv_type_bytes(type_k) + shape.value_length * kv_type_bytes(type_v))
    return int(tokens * shape.layers * per_layer)


@dataclass(frozen=True)
class LlamaSplit:
    gpu_bytes: int
    ram_bytes: int


def llama_split(
    path: Path, gpu_layers: int, tokens: int, type_k: KvCacheType | None = "f16", type_v: KvCacheType | None = "f16"
) -> LlamaSplit:
    """A GGUF loaded by llama.cpp with `gpu_layers` offloaded (-1: all): the GPU holds that
    share of the weights (llama.cpp offloads n_layer + 1, the output layer last), the KV
    cache of the offloaded layers and a compute buffer; the rest stays in RAM."""
    size = path.stat().st_size
    shape = gguf_shape(path)
    if shape is None:  # an architecture without the usual keys: guess 64 KiB per token
        kv_all = tokens * 64 * 1024
        layers = 1
    else:
        kv_all, layers = kv_cache_bytes(shape, tokens, type_k, type_v), shape.layers
    offloaded = layers + 1 if gpu_layers < 0 else min(gpu_layers, layers + 1)
    if offloaded == 0:
        return LlamaSplit(0, size + kv_all)
    weights_gpu = size * offloaded // (layers + 1)
    kv_gpu = kv_all * min(offloaded, layers) // layers
    gpu = weights_gpu + kv_gpu + LLAMA_COMPUTE_BUFFER
    return LlamaSplit(gpu, size - weights_gpu + kv_all - kv_gpu)


def safetensors_parameters(folder: Path) -> dict[str, int]:
    """Element counts by stored dtype over the checkpoint's safetensors files, read from their
    headers (8 bytes of length, then JSON: name → dtype, shape, offsets). Empty when there are
    none or one is unreadable: the estimate then falls back to the files' size, and the load
    itself says what is wrong with the file."""
    counts: dict[str, int] = {}
    try:
        for file in _checkpoint_files(folder):
            for dtype, count in _header_counts(file).items():
                counts[dtype] = counts.get(dtype, 0) + count
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return {}
    return counts


def _header_counts(file: Path) -> dict[str, int]:
    with file.open("rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        if length > 100 * MiB:
            raise ValueError(f"{file}: a safetensors header of {length:,} bytes is not believable")
        header = json.loads(stream.read(length))
    counts: dict[str, int] = {}
    for name, tensor in header.items():
        if name != "__metadata__":
            counts[tensor["dtype"]] = counts.get(tensor["dtype"], 0) + prod(tensor["shape"])
    return counts


def _checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files transformers loads: those its index names (a sharded checkpoint),
    else `model.safetensors`, else every one (a repo may also ship a `consolidated.safetensors`
    for another loader: counting both would double the estimate)."""
    if not folder.is_dir():
        return []
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        return [folder / name for name in sorted(shards) if (folder / name).is_file()]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else sorted(folder.glob("*.safetensors"))


def parameters_at(counts: Mapping[str, int], dtype_bytes: int | None) -> int:
    """The weights' bytes once loaded: floating tensors at `dtype_bytes` (None: as stored),
    integer ones as stored."""
    total = 0
    for dtype, count in counts.items():
        floating = dtype.startswith(("F", "BF"))
        total += count * (dtype_bytes if floating and dtype_bytes is not None else DTYPE_BYTES.get(dtype, 4))
    return total
