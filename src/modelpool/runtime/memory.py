"""Memory: the process's RSS, the machine's memory, and handing freed memory back to the
operating system after an unload (what each model uses is `memory_accounts`')."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable
from functools import cache

import psutil


def process_rss() -> int:
    return int(psutil.Process().memory_info().rss)


def release_freed_memory() -> None:
    """Collect garbage and ask glibc to return free heap pages to the OS (and PyTorch its
    cached GPU memory to the driver), so that an unload shows up in the process RSS and the
    GPUs' used memory instead of sitting in an allocator's free lists."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    # PyTorch keeps freed GPU memory in its cache: the budget counts it free, so give it
    # back to the driver (another engine, or another process, may need it). Seen on an H200:
    # unloading a model left the GPU's used memory unchanged until this.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


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
