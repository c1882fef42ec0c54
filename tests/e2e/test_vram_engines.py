"""VRAM through a real `modelpool serve` process whose NVML binding is the stand-in
(`tests/nvml_site/pynvml.py` first on its PYTHONPATH, numbers in a JSON file): a real
`llama_server` engine process is found by PID in NVML's per-process list, its GPU estimate
from the GGUF counts at admission, and /v1/admin/gpu-memory and /metrics show both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from modelpool.client import AdminClient
from tests.e2e.conftest import smollm2_gguf
from tests.nvml_standin import GiB, one_gpu
from tests.processes import modelpool_serve

ROOT = Path(__file__).resolve().parents[2]
ENGINE_GPU_BYTES = 300 * 1024 * 1024
"""What the stand-in says each of the server's child processes holds on the GPU."""


def engine(context_length: int) -> dict[str, object]:
    options = {"context_length": context_length, "gpu_layers": -1, "stop_grace_s": 5}
    return {"backend": "llama_server", "source": str(smollm2_gguf()), "preload": False, "options": options}


def test_engine_vram_is_estimated_budgeted_and_measured_by_pid(tmp_path: Path) -> None:
    numbers = tmp_path / "nvml.json"
    tree = {"pid": "self", "gpu": 0, "used": ENGINE_GPU_BYTES}
    numbers.write_text(json.dumps(one_gpu(total=80 * GiB, used=GiB, descendants_of=tree)))
    config = {
        "starter_models": False, "state_dir": str(tmp_path / "state"),
        "pool": {"gpu_memory_budget_bytes": "2GiB"},
        "enabled_models": ["small", "huge"],
        # 128k tokens of f16 KV cache over 30 layers: ~2.8 GiB, past the 2 GiB GPU budget.
        "models": {"small": engine(2048), "huge": engine(131072)},
    }  # fmt: skip
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    env = {
        "MODELPOOL_TEST_NVML": str(numbers),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "nvml_site"), str(ROOT), str(ROOT / "src")]),
    }
    with (
        modelpool_serve(tmp_path / "server.log", "-c", str(config_file), env=env) as server,
        httpx.Client(base_url=server.url, timeout=120) as admin,
    ):
        before = admin.get("/v1/admin/gpu-memory").json()
        assert before["available"] is True and before["budget"]["gpu_memory_bytes"] == 2 * GiB
        (gpu,) = before["gpus"]
        assert (gpu["name"], gpu["total_bytes"], gpu["used_bytes"]) == ("Stand-in H100", 80 * GiB, GiB)
        assert {row["model"]: row["replicas"] for row in before["models"]} == {"small": [], "huge": []}

        loaded = admin.post("/v1/admin/models/small/load")
        assert loaded.status_code == 200, loaded.text
        engine_pid = loaded.json()["replicas"][0]["pid"]
        with AdminClient(server.url) as sdk:  # the SDK reads the same report
            rows = {row["model"]: row for row in sdk.gpu_memory()["models"]}
        (replica,) = rows["small"]["replicas"]
        assert replica["source"] == "nvml" and engine_pid in replica["pids"] and replica["devices"] == ["cuda:0"]
        assert replica["measured_bytes"] == ENGINE_GPU_BYTES * len(replica["pids"])
        assert rows["small"]["counted_bytes"] == replica["measured_bytes"]  # measured, not estimated
        assert rows["small"]["estimate_bytes"] > smollm2_gguf().stat().st_size  # weights + KV + buffer

        refused = admin.post("/v1/admin/models/huge/load")
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_capacity" and "MiB of GPU memory" in error["message"]

        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(admin.get("/metrics").text)
            for sample in family.samples
        }
        total = (("device", "cuda:0"), ("kind", "total"), ("name", "Stand-in H100"))
        assert samples[("modelpool_gpu_memory_bytes", total)] == 80 * GiB
        small = (("model", "small"), ("replica", "0"), ("source", "nvml"))
        assert samples[("modelpool_model_gpu_memory_bytes", small)] == replica["measured_bytes"]
        assert admin.post("/v1/admin/models/small/unload").status_code == 200
        after = {row["model"]: row for row in admin.get("/v1/admin/gpu-memory").json()["models"]}
        assert after["small"]["replicas"] == [] and after["small"]["state"] == "unloaded"
