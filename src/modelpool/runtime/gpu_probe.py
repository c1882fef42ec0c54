"""What GPUs this machine has and how much of their memory is in use, read through NVML
(libnvidia-ml, the library nvidia-smi uses) with ctypes, so no Python package is needed and
torch is never imported for it. Without NVML, PyTorch answers if it is already imported."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import cache

from modelpool.runtime.memory import imported_torch
from modelpool.status import GpuMemory

log = logging.getLogger("modelpool.runtime")
GpuProbe = Callable[[], list[GpuMemory]]
"""Each visible GPU's memory now (an empty list: no GPU)."""
_NVML_NAMES = ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll")


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


@cache
def _nvml() -> ctypes.CDLL | None:
    """NVML, initialised once; None when the library or a driver is missing."""
    for name in _NVML_NAMES:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        init = getattr(library, "nvmlInit_v2", None) or getattr(library, "nvmlInit", None)
        if init is not None and init() == 0:
            return library
        log.debug("NVML found but not initialised (no driver?)", extra={"library": name})
    return None


def nvml_gpus() -> list[GpuMemory]:
    library = _nvml()
    if library is None:
        return []
    count = ctypes.c_uint(0)
    if library.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return []
    devices = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        memory = _NvmlMemory()
        if library.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            continue
        if library.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            continue
        devices.append(GpuMemory(f"cuda:{index}", int(memory.total), int(memory.free)))
    return devices


def torch_gpus() -> list[GpuMemory]:
    """Per-device memory from PyTorch, only when it is already imported and sees a GPU."""
    torch = imported_torch()
    if torch is None or not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        devices.append(GpuMemory(f"cuda:{index}", int(total), int(free)))
    return devices


def probe_gpus() -> list[GpuMemory]:
    """The GPUs seen, by NVML, else by an already imported PyTorch; [] on a machine without."""
    return nvml_gpus() or torch_gpus()


def used_bytes(gpus: list[GpuMemory]) -> int:
    return sum(gpu.total_bytes - gpu.free_bytes for gpu in gpus)
