"""Devices for the PyTorch backends: `auto` picks CUDA, then MPS, then the CPU, and a
model's memory need is counted on the device it will sit on."""

from __future__ import annotations

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
