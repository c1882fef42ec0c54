"""A random-weight Llama written straight to a GGUF with the `gguf` package, for the GPU
check (scripts/gpu_check.py): the GPU machine has no network and the starter GGUF (98 MB)
does not fit what a device call carries, so the model is made there. llama.cpp's own
converter cannot take it (it refuses a BPE pre-tokenizer it has no hash for, as this
self-trained one is), so the tensors and keys are written here, as llama.cpp reads a
`llama` GGUF. The tokenizer is gpu_memory_check's byte-level BPE (`tokenizer.ggml.model`
gpt2, pre-tokenizer `default`) with its ChatML template. Weights are float16, seeded.

    PYTHONPATH=src python scripts/gpu_check_gguf.py OUT.gguf [--layers 8 --hidden 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_memory_check import CHATML, train_tokenizer  # a sibling script, not a package


@dataclass(frozen=True)
class Shape:
    layers: int = 8
    hidden: int = 1024
    intermediate: int = 2816
    heads: int = 16
    context: int = 2048

    def parameters(self, vocabulary: int) -> int:
        per_layer = 4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return 2 * vocabulary * self.hidden + self.layers * per_layer + self.hidden


def write_llama_gguf(path: Path, shape: Shape = Shape(), seed: int = 0) -> Path:
    """The GGUF at `path` (written once; returned at once when it exists)."""
    if path.is_file():
        return path
    import gguf
    import numpy as np

    tokenizer = train_tokenizer()
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocabulary = len(tokenizer)
    writer = gguf.GGUFWriter(str(path.with_suffix(".partial")), "llama")
    _write_keys(writer, shape, vocabulary)
    _write_tokenizer(writer, tokenizer, spec)
    rng = np.random.default_rng(seed)

    def weight(*dims: int) -> Any:  # numpy (out, in) is ggml's (in, out): as a torch Linear's weight
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(shape.hidden, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(vocabulary, shape.hidden))
    for i in range(shape.layers):
        block = f"blk.{i}."
        writer.add_tensor(block + "attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}{name}.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(block + "ffn_norm.weight", ones)
        writer.add_tensor(block + "ffn_gate.weight", weight(shape.intermediate, shape.hidden))
        writer.add_tensor(block + "ffn_up.weight", weight(shape.intermediate, shape.hidden))
        writer.add_tensor(block + "ffn_down.weight", weight(shape.hidden, shape.intermediate))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(vocabulary, shape.hidden))
    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    path.with_suffix(".partial").rename(path)
    return path


def _write_keys(writer: Any, shape: Shape, vocabulary: int) -> None:
    writer.add_name("gpu-check random llama")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocabulary)
    writer.add_file_type(1)  # mostly F16


def _write_tokenizer(writer: Any, tokenizer: Any, spec: dict[str, Any]) -> None:
    vocab: dict[str, int] = dict(tokenizer.get_vocab())
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {added["content"] for added in spec.get("added_tokens", []) if added.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in specials else 1 for token in tokens])  # 3: control, 1: normal
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=Shape.layers)
    parser.add_argument("--hidden", type=int, default=Shape.hidden)
    parser.add_argument("--intermediate", type=int, default=Shape.intermediate)
    parser.add_argument("--heads", type=int, default=Shape.heads)
    args = parser.parse_args()
    shape = Shape(args.layers, args.hidden, args.intermediate, args.heads)
    print(write_llama_gguf(args.out, shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
