"""Devices for the PyTorch backends: `auto` picks CUDA, then MPS, then the CPU, and a
model's memory need is counted on the device it will sit on."""

from __future__ import annotations

from typing import Any

from modelpool.backends.base import MemoryEstimate


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def estimate_on(device: str, working_bytes: int, host_bytes: int) -> MemoryEstimate:
    """`working_bytes` on the GPU when the device is one (plus `host_bytes` of RAM), else all in RAM."""
    if pick_device(device).startswith(("cuda", "mps")):
        return MemoryEstimate(ram_bytes=host_bytes, gpu_bytes=working_bytes)
    return MemoryEstimate(ram_bytes=working_bytes)


def weights_placement(model: Any, device: Any) -> dict[str, str]:
    """Where a loaded model's weights are: accelerate's `hf_device_map` (module → device, a
    GPU index written `cuda:N`) when it placed them, else `{"": device}`."""
    mapping = getattr(model, "hf_device_map", None)
    if not mapping:
        return {"": str(device)}
    return {str(name): f"cuda:{where}" if isinstance(where, int) else str(where) for name, where in mapping.items()}
