"""Small LoRA adapters for SmolLM2-135M, built in the tests: random A, non-zero B, rank 8 on
the attention's q and v projections. Each adapter exists in PEFT's form (adapter_config.json +
adapter_model.safetensors, for the transformers engine) and in llama.cpp's LoRA GGUF form
(for the in-process llama.cpp engine), the same numbers in both. Written once into the test
cache, reused by later sessions.

llama.cpp's LoRA GGUF (its convert_lora_to_gguf.py): `general.type = adapter`,
`adapter.type = lora`, `adapter.lora.alpha`; per target weight `<gguf name>.lora_a` of
numpy shape (r, n_in) and `.lora_b` of shape (n_out, r) — PEFT's own lora_A/lora_B shapes
(ggml reverses the dimensions, so llama.cpp sees a: [n_in, r], b: [r, n_out]). The update
is scale · alpha / r · B·A, as PEFT's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.hub_repos import smollm2_gguf
from tests.vlm_models import _cached, default_cache_dir

BUILD_VERSION = 1
RANK, ALPHA = 8, 16.0
LAYERS, HIDDEN, KV_DIM = 30, 576, 192
"""SmolLM2-135M: 30 layers, hidden 576, 3 KV heads of 64."""
SEEDS = {"pirate": 11, "poet": 23}
"""The adapters the tests use, by name."""


def lora_gguf(name: str, cache_dir: Path | None = None) -> Path:
    """The adapter `name` (a key of SEEDS) as a llama.cpp LoRA GGUF."""
    folder = _cached(cache_dir or default_cache_dir(), f"lora-{name}-v{BUILD_VERSION}", lambda f: _write(f, name))
    return folder / "adapter.gguf"


def peft_folder(name: str, cache_dir: Path | None = None) -> Path:
    """The adapter `name` as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)."""
    return lora_gguf(name, cache_dir).parent


def broken_peft_folder(cache_dir: Path | None = None) -> Path:
    """A PEFT adapter folder whose config is sound but whose weights do not fit the model: the
    poet adapter with the last layer's v_proj lora_B one row short. PEFT injects every LoRA
    layer before it meets the bad shape, so a load fails half done."""

    def write(folder: Path) -> None:
        tensors = lora_tensors("poet")
        a, b = tensors[LAYERS - 1, "v"]
        tensors[LAYERS - 1, "v"] = (a, b[:-1])
        _write_peft(folder, tensors)

    return _cached(cache_dir or default_cache_dir(), f"lora-broken-v{BUILD_VERSION}", write)


def lora_tensors(name: str) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """(layer, "q" or "v") → (A of shape (r, n_in), B of shape (n_out, r)), float32."""
    rng = np.random.default_rng(SEEDS[name])
    made = {}
    for layer in range(LAYERS):
        for target, n_out in (("q", HIDDEN), ("v", KV_DIM)):
            a = (rng.standard_normal((RANK, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
            b = (rng.standard_normal((n_out, RANK)) * 0.05).astype(np.float32)
            made[layer, target] = (a, b)
    return made


def _write(folder: Path, name: str) -> None:
    tensors = lora_tensors(name)
    _write_gguf(folder / "adapter.gguf", tensors)
    _write_peft(folder, tensors)


def _write_gguf(path: Path, tensors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]) -> None:
    import gguf

    arch = gguf.GGUFReader(smollm2_gguf()).fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, ALPHA)
    for (layer, target), (a, b) in tensors.items():
        writer.add_tensor(f"blk.{layer}.attn_{target}.weight.lora_a", a)
        writer.add_tensor(f"blk.{layer}.attn_{target}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_peft(folder: Path, tensors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]) -> None:
    from safetensors.numpy import save_file

    weights = {}
    for (layer, target), (a, b) in tensors.items():
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}_proj"
        weights[f"{prefix}.lora_A.weight"] = a
        weights[f"{prefix}.lora_B.weight"] = b
    save_file(weights, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": ALPHA,
        "target_modules": ["q_proj", "v_proj"],
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "base_model_name_or_path": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
