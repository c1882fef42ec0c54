"""The NVML stand-in (`tests/nvml_standin.py`) under the binding's own module name, for a
modelpool server subprocess: a test puts this folder first on the server's PYTHONPATH and
the numbers in a JSON file named by MODELPOOL_TEST_NVML (read at every call, so the test
may change them while the server runs). Tests only: nothing in modelpool knows of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.nvml_standin import NVMLError, StandinNvml


def _numbers() -> dict[str, Any]:
    numbers: dict[str, Any] = json.loads(Path(os.environ["MODELPOOL_TEST_NVML"]).read_text())
    return numbers


_standin = StandinNvml(_numbers)
nvmlInit = _standin.nvmlInit
nvmlDeviceGetCount = _standin.nvmlDeviceGetCount
nvmlDeviceGetHandleByIndex = _standin.nvmlDeviceGetHandleByIndex
nvmlDeviceGetName = _standin.nvmlDeviceGetName
nvmlDeviceGetUUID = _standin.nvmlDeviceGetUUID
nvmlDeviceGetMemoryInfo = _standin.nvmlDeviceGetMemoryInfo
nvmlMemory_v2 = _standin.nvmlMemory_v2
nvmlDeviceGetComputeRunningProcesses = _standin.nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses = _standin.nvmlDeviceGetGraphicsRunningProcesses
__all__ = ["NVMLError"]
