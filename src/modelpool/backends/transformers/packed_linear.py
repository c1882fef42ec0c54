"""The model's linear layers on oneDNN with weights packed once at load (CPU, float32).

The profile of the engine's decode step on SmolLM2-135M: ~75–80% of it is the linear
layers' matrix products (MLP, attention projections, the LM head), the rest Python, the
KV cache and sampling. PyTorch's default CPU `F.linear` goes to MKL's sgemm, which on
the small row counts of a decode step (1–32 sequences) measured 2–3× slower than a
oneDNN inner product on weights reordered once into its blocked layout (what vLLM's CPU
backend does too). oneDNN also gives a row the same result in any batch of 2 rows or
more; a lone row may take another kernel path (SmolLM2's 1536-wide down projection: ~2e-6
off the same row in a batch). Padding a lone row to 2 measured 1.2-2.5x slower per layer,
so it is not done: a lone sequence's greedy tokens can differ from its batched ones only on
a near-tie. MKL's `F.linear` (the default) differs for 1-3 rows against bigger batches.

The packed weight replaces the layer's own (no second copy), except where the weight is
tied to another module (the LM head sharing the input embeddings): there the packed copy
is extra memory, counted by `extra_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward, on a weight packed for oneDNN (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        # Without a batch-size hint the layout serves any number of rows.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=onednn"


def can_pack(model: Any) -> str | None:
    """Why `model`'s linears cannot be packed, or None when they can: oneDNN in this torch
    build, float32 weights on the CPU."""
    if not torch._C._has_mkldnn:  # torch.backends.mkldnn.is_available(), which is untyped
        return "this PyTorch build has no oneDNN"
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return f"the weights are {parameter.dtype} on {parameter.device.type} (packing is for float32 on the CPU)"
    return None


def pack_linears(model: nn.Module, keep: Callable[[str], bool] | None = None) -> int:
    """Replace every plain `nn.Linear` in `model` by a `PackedLinear` (but those whose
    qualified name `keep` says: LoRA targets, which PEFT wraps later); the bytes the packed
    copies of tied weights add (their other user keeps the original)."""
    tied = _tied_weights(model)
    extra = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if keep is not None and keep(f"{parent_name}.{name}" if parent_name else name):
                continue
            if type(child) is nn.Linear:  # subclasses (adapters, quantised layers) keep their own forward
                if id(child.weight) in tied:
                    extra += child.weight.numel() * child.weight.element_size()
                setattr(parent, name, PackedLinear(child))
    return extra


def _tied_weights(model: nn.Module) -> set[int]:
    """Ids of linear weights another module also holds (tied embeddings)."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    return {pid for pid, count in holders.items() if count > 1}
