"""A stand-in for the NVML binding (`pynvml`, from nvidia-ml-py): the same functions and
`NVMLError`, answering from numbers a test gives, so the GPU paths run on a machine
without a GPU. `install` puts it where `modelpool.runtime.gpu_probe` obtains the binding
(`sys.modules["pynvml"]`); `tests/nvml_site/pynvml.py` is the same stand-in for a server
subprocess (put that folder on its PYTHONPATH, the numbers in a JSON file named by
MODELPOOL_TEST_NVML).

Numbers: `{"gpus": [{"name", "uuid", "total", "used", "reserved"?, "v1_only"?}], "processes": [{"gpu", "pid",
"used"}], "descendants_of": {"pid", "gpu", "used"}, "fail": "..."}`. A GPU's used memory is
its `used` (other users' memory) plus what its listed processes hold; `descendants_of` lists
every living descendant of that PID (`"self"`: the process reading, a server whose engine
processes are its descendants) with `used` bytes each;
`fail` makes nvmlInit raise (no driver)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

GiB = 1024**3
Numbers = dict[str, Any] | Callable[[], dict[str, Any]]


class NVMLError(Exception):
    pass


class StandinNvml:
    NVMLError = NVMLError

    def __init__(self, numbers: Callable[[], dict[str, Any]]) -> None:
        self._numbers = numbers
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self._numbers().get("fail"):
            raise NVMLError(self._numbers()["fail"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self._numbers()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._numbers()["gpus"][handle]["name"])

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return str(self._numbers()["gpus"][handle]["uuid"])

    nvmlMemory_v2 = 0x02000028  # the binding's constant (struct size | version 2 << 24)

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        """v1 (no `version`): used holds the driver's `reserved` (default 0); v2: apart, as
        nvidia-smi shows it. A GPU's `"v1_only": true` answers v2 as an old driver does."""
        gpu = self._numbers()["gpus"][handle]
        used = int(gpu["used"]) + sum(p.usedGpuMemory for p in self.nvmlDeviceGetComputeRunningProcesses(handle))
        reserved, total = int(gpu.get("reserved", 0)), int(gpu["total"])
        if version is None:
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        if version != self.nvmlMemory_v2 or gpu.get("v1_only"):
            raise NVMLError("Function Not Found")
        return SimpleNamespace(version=version, total=total, reserved=reserved, used=used, free=total - used - reserved)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        numbers = self._numbers()
        listed = [(int(p["pid"]), int(p["used"])) for p in numbers.get("processes", []) if p["gpu"] == handle]
        tree = numbers.get("descendants_of")
        if tree is not None and tree["gpu"] == handle:
            root = os.getpid() if tree["pid"] == "self" else int(tree["pid"])
            listed += [(pid, int(tree["used"])) for pid in _descendants(root)]
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return []


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def one_gpu(total: int = 80 * GiB, used: int = GiB, **more: Any) -> dict[str, Any]:
    return {"gpus": [{"name": "Stand-in H100", "uuid": "GPU-standin-0", "total": total, "used": used}], **more}


@pytest.fixture
def nvml_standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Numbers], StandinNvml]]:
    """`nvml_standin(numbers)` makes the stand-in the binding modelpool finds (`numbers` a
    dict, or a function giving one at each call) until the test ends."""
    from modelpool.runtime import gpu_probe

    def install(numbers: Numbers) -> StandinNvml:
        standin = StandinNvml(numbers if callable(numbers) else lambda: numbers)
        monkeypatch.setitem(sys.modules, "pynvml", standin)
        gpu_probe.nvml.cache_clear()
        return standin

    yield install
    gpu_probe.nvml.cache_clear()  # the real binding (or none) again, once monkeypatch undoes
