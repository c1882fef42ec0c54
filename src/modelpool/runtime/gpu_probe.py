"""What GPUs this machine has, how much of their memory is in use, and by which processes,
read through NVML (the library nvidia-smi uses) with its maintained binding `nvidia-ml-py`
(module `pynvml`), so torch is never imported for it. Without NVML (no binding, no
library, no driver) there is "no GPU" as far as NVML goes, said once in the log; PyTorch
answers the totals then if it is already imported.

The binding is obtained in one place (`nvml()`, from `sys.modules`/import of `pynvml`):
tests put a stand-in with the same functions and `NVMLError` there, fed numbers."""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from modelpool.runtime.memory import imported_torch
from modelpool.status import GpuMemory, GpuProcess

log = logging.getLogger("modelpool.runtime")
GpuProbe = Callable[[], list[GpuMemory]]
"""Each visible GPU's memory now (an empty list: no GPU)."""


NVML_RETRY_S = 60.0
"""How long a failed NVML start is believed before it is tried again (a driver loaded after
the server started, a container given its GPU late)."""


class _Nvml:
    """The `pynvml` module, initialised once; None while it cannot answer, tried again at
    most every NVML_RETRY_S (logged at info the first time, debug after)."""

    def __init__(self) -> None:
        self._binding: Any | None = None
        self._failed_at: float | None = None
        self._said = False

    def __call__(self) -> Any | None:
        if self._binding is not None:
            return self._binding
        if self._failed_at is not None and time.monotonic() - self._failed_at < NVML_RETRY_S:
            return None
        self._binding = self._start()
        self._failed_at = None if self._binding is not None else time.monotonic()
        return self._binding

    def cache_clear(self) -> None:
        """Forget the binding and any failure (tests put a stand-in in its place)."""
        self._binding, self._failed_at, self._said = None, None, False

    def _start(self) -> Any | None:
        try:
            binding = importlib.import_module("pynvml")
        except ImportError:
            self._say("NVML binding not installed (pip install nvidia-ml-py): no GPU seen through NVML", None)
            return None
        try:
            binding.nvmlInit()
        except binding.NVMLError as exc:  # no libnvidia-ml, no driver, a driver/library mismatch
            self._say("NVML not available: no GPU seen through NVML", str(exc))
            return None
        return binding

    def _say(self, message: str, reason: str | None) -> None:
        log.log(logging.DEBUG if self._said else logging.INFO, message, extra={"reason": reason})
        self._said = True


nvml = _Nvml()


def _text(value: str | bytes) -> str:
    """Old bindings answer bytes, new ones str."""
    return value.decode() if isinstance(value, bytes) else value


def _memory_info(binding: Any, handle: Any) -> Any:
    """NVML's v2 memory info, whose `used` is nvidia-smi's memory.used (v1's also holds the
    driver's reserved memory, hundreds of MiB on a large GPU); v1 where the binding or the
    driver has no v2."""
    version = getattr(binding, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return binding.nvmlDeviceGetMemoryInfo(handle, version=version)
        except binding.NVMLError:  # a driver older than v2 (NVML_ERROR_FUNCTION_NOT_FOUND and the like)
            pass
    return binding.nvmlDeviceGetMemoryInfo(handle)


def nvml_gpus() -> list[GpuMemory]:
    binding = nvml()
    if binding is None:
        return []
    try:
        count = binding.nvmlDeviceGetCount()
    except binding.NVMLError as exc:  # the driver went away
        log.warning("NVML could not read the GPUs", extra={"reason": str(exc)})
        return []
    devices = []
    for index in range(count):
        try:
            devices.append(_device(binding, index))
        except binding.NVMLError as exc:  # this GPU fell off the bus: the others still answer
            log.warning("NVML could not read a GPU", extra={"device": f"cuda:{index}", "reason": str(exc)})
    return devices


def _device(binding: Any, index: int) -> GpuMemory:
    handle = binding.nvmlDeviceGetHandleByIndex(index)
    memory = _memory_info(binding, handle)
    return GpuMemory(
        f"cuda:{index}", int(memory.total), int(memory.free), int(memory.used), index,
        _text(binding.nvmlDeviceGetName(handle)), _text(binding.nvmlDeviceGetUUID(handle)),
        int(getattr(memory, "reserved", 0)),
    )  # fmt: skip


def nvml_processes() -> dict[int, GpuProcess]:
    """Every process NVML sees on the GPUs (compute and graphics contexts), by PID, with the
    memory it holds summed over the devices. PIDs are the host's: a process in a container
    shows under its host PID. Empty without NVML."""
    binding = nvml()
    if binding is None:
        return {}
    used: dict[int, int] = {}
    devices: dict[int, list[str]] = {}
    try:
        count = binding.nvmlDeviceGetCount()
    except binding.NVMLError as exc:
        log.warning("NVML could not list the GPUs' processes", extra={"reason": str(exc)})
        return {}
    for index in range(count):
        try:
            seen = _device_processes(binding, index)
        except binding.NVMLError as exc:  # this GPU's list only: the others still answer
            log.warning("NVML could not list a GPU's processes", extra={"device": f"cuda:{index}", "reason": str(exc)})
            continue
        for pid, size in seen.items():
            used[pid] = used.get(pid, 0) + size
            devices.setdefault(pid, []).append(f"cuda:{index}")
    return {pid: GpuProcess(pid, used[pid], tuple(devices[pid])) for pid in used}


def pids_are_nvmls() -> bool:
    """Whether NVML's PIDs are this process's own: NVML lists the host's PIDs, which a process
    in a container's PID namespace does not know itself by (its NSpid has several)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # not Linux: no PID namespaces
        return True
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [str(os.getpid())])
    return len(nspid) == 1


def own_gpu_meter(gpus: GpuProbe) -> Callable[[], int]:
    """What measures GPU memory that this process itself takes: its own bytes in NVML's
    per-process lists (0 while it has no context) where NVML's PIDs are its own, so an
    engine process growing meanwhile is not counted with it; else every GPU's used memory."""
    if nvml() is not None and pids_are_nvmls():
        return lambda: process_bytes(os.getpid())
    return lambda: used_bytes(gpus())


def process_bytes(pid: int) -> int:
    listed = nvml_processes().get(pid)
    return 0 if listed is None else listed.used_bytes


def _device_processes(binding: Any, index: int) -> dict[int, int]:
    handle = binding.nvmlDeviceGetHandleByIndex(index)
    seen: dict[int, int] = {}
    for reader in (binding.nvmlDeviceGetComputeRunningProcesses, binding.nvmlDeviceGetGraphicsRunningProcesses):
        for process in reader(handle):
            # A process with both contexts is listed twice with the same memory;
            # usedGpuMemory is None where NVML may not say (some containers, Windows WDDM).
            seen[int(process.pid)] = max(seen.get(int(process.pid), 0), int(process.usedGpuMemory or 0))
    return seen


def processes_use(pids: Iterable[int], seen: dict[int, GpuProcess]) -> GpuProcess | None:
    """What `pids` together hold on the GPUs (None: none of them is on a GPU)."""
    mine = [seen[pid] for pid in pids if pid in seen]
    if not mine:
        return None
    devices = sorted({device for process in mine for device in process.devices})
    return GpuProcess(mine[0].pid, sum(process.used_bytes for process in mine), tuple(devices))


def torch_gpus() -> list[GpuMemory]:
    """Per-device memory from PyTorch, only when it is already imported and sees a GPU."""
    torch = imported_torch()
    if torch is None or not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        name = str(torch.cuda.get_device_name(index))
        devices.append(GpuMemory(f"cuda:{index}", int(total), int(free), index=index, name=name))
    return devices


def probe_gpus() -> list[GpuMemory]:
    """The GPUs seen, by NVML, else by an already imported PyTorch; [] on a machine without."""
    return nvml_gpus() or torch_gpus()


def used_bytes(gpus: list[GpuMemory]) -> int:
    return sum(gpu.used_bytes for gpu in gpus)
