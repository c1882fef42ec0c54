"""Where the process's memory went: its baseline when the pool was built, each runtime's
first import (torch, onnxruntime, ...: counted once, apart), and each model's load, by
ledgers that share growth out so the parts add up (`memory_ledger`). The GPUs get a ledger
of their own when one is seen. The budget counts the baseline and runtimes too."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from modelpool.backends.base import MemoryEstimate
from modelpool.backends.runtime_modules import KNOWN_RUNTIMES
from modelpool.runtime.gpu_probe import GpuProbe, nvml_gpus, own_gpu_meter, used_bytes
from modelpool.runtime.memory import process_rss
from modelpool.runtime.memory_ledger import Ledger, Window

log = logging.getLogger("modelpool.runtime")
GpuMeter = Callable[[], int] | None
RUNTIME_WEIGHT = 256 * 1024 * 1024
"""A runtime import's weight when a load's window is open beside it (what a first import of
a runtime typically costs), so growth then is shared in rough proportion."""


@dataclass(eq=False)
class LoadWindows:
    """A load being measured: its share of the process's growth, and of the GPUs'."""

    ram: Window | None
    gpu: Window | None


@dataclass(frozen=True)
class Measured:
    ram_bytes: int = 0
    gpu_bytes: int = 0


class MemoryAccounts:
    def __init__(self, *, rss: Ledger | None = None, gpus: GpuProbe = nvml_gpus, gpu_meter: GpuMeter = None) -> None:
        """`gpus` reads the GPUs: NVML only by default (cheap, and never PyTorch, whose probe
        would create a CUDA context on every device). `gpu_meter` is read at every load's
        start and end (default: this process's own GPU memory where NVML lists it by PID,
        every GPU's used memory otherwise, `own_gpu_meter`)."""
        self.ram = rss or Ledger(process_rss)
        seen = gpus()
        self.gpus_at_start = seen
        self.gpu_at_start = used_bytes(seen)
        """What every GPU held (by anyone) when the pool was built."""
        self.gpu: Ledger | None = Ledger(gpu_meter or self._meter(gpus)) if seen else None
        """GPU memory this process takes, shared out among its in-process loads; None without a GPU."""
        self.runtimes: dict[str, int] = {}
        """Runtime (top-level module) → the process growth its first import caused."""
        self.gpu_runtimes: dict[str, int] = {}
        """GPU memory a runtime holds once per process (PyTorch's CUDA context)."""
        self._imports = asyncio.Lock()

    @staticmethod
    def _meter(gpus: GpuProbe) -> Callable[[], int]:
        return own_gpu_meter(gpus) if gpus is nvml_gpus else lambda: used_bytes(gpus())  # a test's numbers

    @property
    def baseline_bytes(self) -> int:
        return self.ram.start

    def runtimes_bytes(self) -> int:
        return sum(self.runtimes.values())

    def overhead(self) -> MemoryEstimate:
        """What the budget holds back before any model: the process's baseline and runtimes
        (RAM), and what the GPUs already held when the pool was built."""
        gpu = self.gpu_at_start + sum(self.gpu_runtimes.values()) if self.gpu else 0
        return MemoryEstimate(self.baseline_bytes + self.runtimes_bytes(), gpu)

    async def import_runtimes(self, modules: tuple[str, ...]) -> None:
        """Import the runtimes not imported yet, one at a time, each measured as its own.
        A module that fails to import is left for the backend to report (with its extra)."""
        async with self._imports:
            for module in modules:
                if module in sys.modules:
                    continue  # imported before (the baseline, or another runtime): not ours to count
                window = self.ram.open(RUNTIME_WEIGHT)
                try:
                    await asyncio.to_thread(importlib.import_module, module)
                except Exception as exc:  # ImportError, or a broken install's own error
                    log.debug("runtime not importable", extra={"module": module, "error": str(exc)})
                finally:
                    grown = self.ram.close(window)
                if module in sys.modules:
                    self.runtimes[module.split(".")[0]] = self.runtimes.get(module.split(".")[0], 0) + grown
            if "torch" in modules and "torch" in sys.modules:  # imported here or before (a backend class)
                await self._start_cuda()

    async def _start_cuda(self) -> None:
        """With a GPU seen, create PyTorch's CUDA context now, measured as the runtime's: it
        costs a few hundred MB of GPU memory (and some RAM) once per process, and would
        otherwise be charged to whichever model touched CUDA first."""
        torch = sys.modules["torch"]
        if self.gpu is None or "torch (CUDA)" in self.gpu_runtimes or not torch.cuda.is_available():
            return
        ram, gpu = self.ram.open(RUNTIME_WEIGHT), self.gpu.open(RUNTIME_WEIGHT)
        try:
            await asyncio.to_thread(torch.zeros, 1, device="cuda")
        except Exception as exc:  # a broken driver: the model's load will say so
            log.debug("CUDA context not created", extra={"error": str(exc)})
        finally:
            self.runtimes["torch"] = self.runtimes.get("torch", 0) + self.ram.close(ram)
            self.gpu_runtimes["torch (CUDA)"] = self.gpu.close(gpu)

    @contextmanager
    def side_imports(self) -> Iterator[None]:
        """Synchronous code that may import a runtime as a side effect (a backend class whose
        module imports torch, as the registry resolves a model's capabilities): its growth
        is the first new runtime's, else modelpool's own (the baseline moves up)."""
        before = {module for module in KNOWN_RUNTIMES if module in sys.modules}
        window = self.ram.open(1)
        try:
            yield
        finally:
            grown = self.ram.close(window)
            new = [module for module in KNOWN_RUNTIMES if module in sys.modules and module not in before]
            if new:
                self.runtimes[new[0]] = self.runtimes.get(new[0], 0) + grown
            else:
                self.ram.start += grown

    def open_load(self, estimate: MemoryEstimate, *, in_process: bool) -> LoadWindows:
        """Start measuring a load, weighted by its estimate. An engine in a process of its
        own (or a remote one) grows nothing here: it gets no RAM window."""
        ram = self.ram.open(estimate.ram_bytes) if in_process else None
        gpu = self.gpu.open(estimate.gpu_bytes) if self.gpu is not None and in_process else None
        return LoadWindows(ram, gpu)

    def close_load(self, windows: LoadWindows) -> Measured:
        ram = self.ram.close(windows.ram) if windows.ram is not None else 0
        gpu = self.gpu.close(windows.gpu) if self.gpu is not None and windows.gpu is not None else 0
        return Measured(ram, gpu)

    def open_release(self) -> LoadWindows:
        """An unload is starting: what the meters lose meanwhile is nobody's negative growth."""
        return LoadWindows(self.ram.open(1, absorbs=True), self.gpu.open(1, absorbs=True) if self.gpu else None)

    def close_release(self, windows: LoadWindows) -> None:
        self.close_load(windows)
