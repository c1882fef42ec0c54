"""Memory: the process's RSS, the machine's memory, and handing freed memory back to the
operating system after an unload (what each model uses is `memory_accounts`')."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import psutil


def process_rss() -> int:
    return int(psutil.Process().memory_info().rss)


def settle_heap() -> None:
    """Put every object alive now out of the cyclic garbage collector's reach (`gc.freeze`):
    called once the server serves and after each model load. Why: with PyTorch and
    transformers imported the heap holds ~550,000 tracked objects (modules, schemas, a loaded
    model's Python objects) that live as long as the process or the model, and every full
    collection — set off by the allocations of ordinary requests — walked them all: measured
    0.3–0.9 s on a 2-core machine, a stall of every request in flight, and ~30% more
    event-loop CPU per small request under load. Objects that die by reference counting are
    freed as before; only cycles among frozen objects wait for the next unload
    (`release_freed_memory` thaws the heap first, so an unloaded model's own cycles go)."""
    gc.freeze()


def release_freed_memory() -> None:
    """Collect garbage and ask glibc to return free heap pages to the OS (and PyTorch its
    cached GPU memory to the driver), so that an unload shows up in the process RSS and the
    GPUs' used memory instead of sitting in an allocator's free lists."""
    gc.unfreeze()  # the unloaded model's objects were frozen with the rest (`settle_heap`)
    gc.collect()
    gc.freeze()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    # PyTorch keeps freed GPU memory in its cache: the budget counts it free, so give it
    # back to the driver (another engine, or another process, may need it). Seen on an H200:
    # unloading a model left the GPU's used memory unchanged until this.
    torch = imported_torch()
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def imported_torch() -> Any | None:
    """PyTorch when it is imported and its import has finished, else None (never imports it).
    A runtime import runs on a worker thread (the ledger measures it) while the metrics sampler
    reads memory on another: until that import ends, `sys.modules` holds a half-built torch
    with no `cuda` yet."""
    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    if torch is None or getattr(spec, "_initializing", False) or not hasattr(torch, "cuda"):
        return None
    return torch


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)


def system_memory() -> dict[str, int]:
    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available), "process_rss_bytes": process_rss()}
