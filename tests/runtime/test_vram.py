"""VRAM measured and budgeted, on a machine without a GPU: NVML's numbers come from the
stand-in binding (`tests/nvml_standin.py`), the engine processes are real processes found
by PID, the estimates are the real backends' from real files."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from modelpool.backends.base import MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.gpu_estimates import gguf_shape, kv_cache_bytes, llama_split, parameters_at
from modelpool.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions
from modelpool.backends.llama_knobs import KvCacheType
from modelpool.backends.managed.llama_server import LlamaServerBackend, LlamaServerOptions
from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
from modelpool.config.schema import ModelConfig
from modelpool.errors import InsufficientCapacity
from modelpool.inference import ChatMessage, ChatRequest
from modelpool.pool_api.generation import collect
from modelpool.runtime import gpu_probe
from modelpool.runtime.gpu_probe import nvml_gpus, nvml_processes, probe_gpus
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.memory_ledger import Ledger
from modelpool.runtime.memory_report import pool_memory
from modelpool.runtime.metrics.memory_gauges import MemoryGauges
from modelpool.status import GpuMemory
from tests.e2e.conftest import smollm2_gguf
from tests.fakes import FakeBackend, FakePool, FakeProcessBackend
from tests.nvml_standin import GiB, StandinNvml, nvml_standin, one_gpu
from tests.polling import until

__all__ = ["nvml_standin"]  # the fixture, used by name
MiB = 1024**2
Install = Callable[..., StandinNvml]
REQUEST = ChatRequest((ChatMessage("user", "hello"),))
ON_A_GPU = BackendContext(gpus=lambda: [GpuMemory("cuda:0", 80 * GiB, 80 * GiB)])


@pytest.fixture
def engine_process() -> Iterator[subprocess.Popen[bytes]]:
    """A real process with a child, as an engine and its worker (vLLM forks them)."""
    worker = "import time; time.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code])
    yield process
    for child in psutil.Process(process.pid).children(recursive=True):
        child.kill()
    process.kill()
    process.wait()


def test_nvml_gives_each_gpu_with_its_name_uuid_and_memory(nvml_standin: Install) -> None:
    nvml_standin(one_gpu(used=2 * GiB, processes=[{"gpu": 0, "pid": 4242, "used": 3 * GiB}]))
    (gpu,) = nvml_gpus()
    assert (gpu.device, gpu.index, gpu.name, gpu.uuid) == ("cuda:0", 0, "Stand-in H100", "GPU-standin-0")
    assert (gpu.total_bytes, gpu.used_bytes, gpu.free_bytes) == (80 * GiB, 5 * GiB, 75 * GiB)
    assert probe_gpus() == [gpu]
    (process,) = nvml_processes().values()
    assert (process.pid, process.used_bytes, process.devices) == (4242, 3 * GiB, ("cuda:0",))


def test_used_is_nvidia_smis_with_the_drivers_reserved_memory_apart(nvml_standin: Install) -> None:
    # NVML's v1 memory info counts the driver's reserved memory as used; nvidia-smi and v2 do not.
    reserving = {**one_gpu(used=GiB)["gpus"][0], "reserved": 512 * MiB}
    nvml_standin({"gpus": [reserving]})
    (gpu,) = nvml_gpus()
    assert (gpu.used_bytes, gpu.reserved_bytes, gpu.free_bytes) == (GiB, 512 * MiB, 80 * GiB - GiB - 512 * MiB)
    nvml_standin({"gpus": [{**reserving, "v1_only": True}]})  # an old driver: v1, reserved unknown
    (gpu,) = nvml_gpus()
    assert (gpu.used_bytes, gpu.reserved_bytes) == (GiB + 512 * MiB, 0)


def test_an_in_process_load_is_metered_by_modelpools_own_gpu_memory(
    nvml_standin: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine process (measured by its PID) growing while a model loads in process is not the load's.
    numbers = one_gpu(used=GiB)
    nvml_standin(numbers)
    accounts = MemoryAccounts(rss=Ledger(lambda: GiB))
    window = accounts.open_load(MemoryEstimate(1, gpu_bytes=2 * GiB), in_process=True)
    numbers["processes"] = [{"gpu": 0, "pid": os.getpid(), "used": 2 * GiB}, {"gpu": 0, "pid": 99999, "used": 10 * GiB}]
    assert accounts.close_load(window).gpu_bytes == 2 * GiB
    assert accounts.overhead().gpu_bytes == GiB  # what the GPU held at start, by anyone
    # Where NVML's PIDs are not this process's (a container's PID namespace): every GPU's used memory.
    monkeypatch.setattr(gpu_probe, "pids_are_nvmls", lambda: False)
    accounts = MemoryAccounts(rss=Ledger(lambda: GiB))
    window = accounts.open_load(MemoryEstimate(1, gpu_bytes=2 * GiB), in_process=True)
    numbers["processes"][0]["used"] = 3 * GiB
    assert accounts.close_load(window).gpu_bytes == GiB


def test_no_driver_is_no_gpu_said_once(nvml_standin: Install, caplog: pytest.LogCaptureFixture) -> None:
    standin = nvml_standin({"fail": "Driver Not Loaded", "gpus": []})
    with caplog.at_level(logging.INFO, logger="modelpool.runtime"):
        assert nvml_gpus() == [] and nvml_processes() == {} and nvml_gpus() == []
    assert standin.inits == 1
    assert [r.message for r in caplog.records].count("NVML not available: no GPU seen through NVML") == 1


def test_a_failed_nvml_start_is_tried_again_later(nvml_standin: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    numbers: dict[str, Any] = {**one_gpu(), "fail": "Driver Not Loaded"}
    standin = nvml_standin(numbers)
    assert nvml_gpus() == []
    del numbers["fail"]  # the driver is loaded now
    assert nvml_gpus() == [] and standin.inits == 1  # not tried again at every reading
    monkeypatch.setattr(gpu_probe, "NVML_RETRY_S", 0.0)
    assert [gpu.device for gpu in nvml_gpus()] == ["cuda:0"] and standin.inits == 2


def test_one_failing_gpu_hides_only_itself(nvml_standin: Install) -> None:
    gpu = one_gpu()["gpus"][0]
    listed = [{"gpu": 1, "pid": 7, "used": GiB}]
    standin = nvml_standin({"gpus": [gpu, {**gpu, "uuid": "GPU-standin-1"}], "processes": listed})
    real_memory, real_processes = standin.nvmlDeviceGetMemoryInfo, standin.nvmlDeviceGetComputeRunningProcesses

    def memory(handle: int, version: int | None = None) -> Any:
        if handle == 0:
            raise standin.NVMLError("GPU is lost")
        return real_memory(handle, version)

    def processes(handle: int) -> Any:
        if handle == 0:
            raise standin.NVMLError("GPU is lost")
        return real_processes(handle)

    standin.nvmlDeviceGetMemoryInfo = memory  # type: ignore[method-assign]
    standin.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[method-assign]
    assert [gpu.uuid for gpu in nvml_gpus()] == ["GPU-standin-1"]
    assert nvml_processes()[7].devices == ("cuda:1",)


def test_a_missing_binding_is_no_gpu(nvml_standin: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml_standin(one_gpu())
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    from modelpool.runtime import gpu_probe

    gpu_probe.nvml.cache_clear()
    assert nvml_gpus() == [] and nvml_processes() == {}


def test_an_nvml_error_while_reading_is_no_gpu_not_a_crash(nvml_standin: Install) -> None:
    standin = nvml_standin(one_gpu())

    def fails(handle: int, version: int | None = None) -> Any:
        raise standin.NVMLError("GPU is lost")

    standin.nvmlDeviceGetMemoryInfo = fails  # type: ignore[method-assign]
    standin.nvmlDeviceGetComputeRunningProcesses = fails  # type: ignore[method-assign]
    assert nvml_gpus() == [] and nvml_processes() == {}


async def test_an_engine_process_and_its_children_are_measured_by_pid(
    nvml_standin: Install, engine_process: subprocess.Popen[bytes]
) -> None:
    """The engine's tree is found in NVML's per-process list; the budget then counts that
    measurement, not the estimate, and the report names its source and PIDs."""
    numbers = one_gpu(descendants_of={"pid": engine_process.pid, "gpu": 0, "used": 0})
    nvml_standin(lambda: numbers)
    backend = FakeProcessBackend()
    fakes = FakePool(gpu_bytes=60 * GiB)
    slot = fakes.slot(backend, "engine")
    await collect(await fakes.pool().chat("engine", REQUEST))
    backend.pid = engine_process.pid  # the fake's start() gave it a made-up one
    engine = psutil.Process(engine_process.pid)
    await until(lambda: len(engine.children()) == 1, "the engine's worker to start")
    assert slot.gpu_bytes() == 0  # not on the GPU yet: nothing measured (the estimate is 0)
    numbers["processes"] = [{"gpu": 0, "pid": engine_process.pid, "used": 5 * GiB}]
    numbers["descendants_of"]["used"] = 2 * GiB  # the worker
    assert slot.gpu_bytes() == 5 * GiB + 2 * GiB
    (row,) = pool_memory([slot], fakes.capacity).gpu_models
    (replica,) = row.replicas
    assert (row.model, row.state, replica.source, replica.measured_bytes) == ("engine", "ready", "nvml", 7 * GiB)
    assert replica.pids[0] == engine_process.pid and len(replica.pids) == 2 and replica.devices == ("cuda:0",)


async def test_an_engine_estimate_over_the_gpu_budget_evicts_or_is_refused(nvml_standin: Install) -> None:
    """A llama_server engine's GPU estimate (from the GGUF, all layers offloaded) counts at
    admission: the idle model on the GPU is evicted for it; with no room at all, the clear
    capacity error."""
    nvml_standin(one_gpu())
    gguf = smollm2_gguf()
    config = ModelConfig(id="engine", backend="llama_server", source=str(gguf))
    real = LlamaServerBackend(config, LlamaServerOptions(gpu_layers=-1, context_length=2048), ON_A_GPU)
    estimate = await real.estimate_memory()
    assert estimate.gpu_bytes > gguf.stat().st_size

    class Sized(FakeProcessBackend):
        async def estimate_memory(self) -> MemoryEstimate:
            return estimate

    class Resident(FakeBackend):
        async def estimate_memory(self) -> MemoryEstimate:
            return MemoryEstimate(ram_bytes=10, gpu_bytes=estimate.gpu_bytes // 2)

    fakes = FakePool(gpu_bytes=estimate.gpu_bytes + estimate.gpu_bytes // 4)
    other, engine = fakes.slot(Resident(), "other"), fakes.slot(Sized(), "engine")
    pool = fakes.pool()
    await collect(await pool.chat("other", REQUEST))
    fakes.clock.advance(1)
    await collect(await pool.chat("engine", REQUEST))
    assert (other.state.value, engine.state.value) == ("unloaded", "ready")

    tight = FakePool(gpu_bytes=estimate.gpu_bytes - 1)
    tight.slot(Sized(), "engine")
    with pytest.raises(InsufficientCapacity) as refused:
        await tight.pool().chat("engine", REQUEST)
    assert f"{estimate.gpu_bytes // MiB} MiB of GPU memory" in str(refused.value)


def test_the_kv_cache_estimate_is_what_llama_cpp_allocates(capfd: pytest.CaptureFixture[str]) -> None:
    """llama.cpp says its KV buffer's size when it makes a context: the estimate from the
    GGUF's layers and KV heads equals it, for f16 and a quantised cache type."""
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = smollm2_gguf()
    shape = gguf_shape(gguf)
    assert shape is not None and (shape.layers, shape.kv_heads, shape.key_length) == (30, 3, 64)
    kv_types: tuple[tuple[KvCacheType, int], ...] = (("f16", 1), ("q8_0", 8))
    for type_k, ggml_type in kv_types:
        capfd.readouterr()
        model = llama_cpp.Llama(str(gguf), n_ctx=512, verbose=True, type_k=ggml_type, type_v=ggml_type,
                                flash_attn=type_k != "f16")  # fmt: skip
        del model
        said = next(line for line in capfd.readouterr().err.splitlines() if "KV buffer size" in line)
        reported_mib = float(said.split("=")[1].split("MiB")[0])
        assert kv_cache_bytes(shape, 512, type_k, type_k) / MiB == pytest.approx(reported_mib, abs=0.01)


def test_offloaded_layers_put_their_share_on_the_gpu() -> None:
    gguf = smollm2_gguf()
    size = gguf.stat().st_size
    shape = gguf_shape(gguf)
    assert shape is not None
    kv = kv_cache_bytes(shape, 4096)
    on_cpu, half, whole = llama_split(gguf, 0, 4096), llama_split(gguf, 15, 4096), llama_split(gguf, -1, 4096)
    assert (on_cpu.gpu_bytes, on_cpu.ram_bytes) == (0, size + kv)
    assert whole.ram_bytes == 0 and whole.gpu_bytes == size + kv + 256 * MiB
    assert half.gpu_bytes + half.ram_bytes == size + kv + 256 * MiB  # split, nothing lost or counted twice
    assert half.gpu_bytes == size * 15 // 31 + kv // 2 + 256 * MiB


async def test_the_in_process_llama_cpp_estimate_reads_the_kv_type(nvml_standin: Install) -> None:
    config = ModelConfig(id="chat", backend="llama_cpp", source=str(smollm2_gguf()))
    offloaded = LlamaCppOptions(n_gpu_layers=-1, n_ctx=2048, parallel=2)
    estimate = await LlamaCppBackend(config, offloaded, ON_A_GPU).estimate_memory()
    shape = gguf_shape(smollm2_gguf())
    assert shape is not None
    assert estimate.gpu_bytes == smollm2_gguf().stat().st_size + kv_cache_bytes(shape, 4096) + 256 * MiB
    on_cpu = await LlamaCppBackend(config, LlamaCppOptions(n_ctx=2048), ON_A_GPU).estimate_memory()
    assert on_cpu.gpu_bytes == 0
    no_gpu = await LlamaCppBackend(config, offloaded, BackendContext()).estimate_memory()  # a CPU build runs it all
    assert no_gpu.gpu_bytes == 0 and no_gpu.ram_bytes == estimate.gpu_bytes - 256 * MiB + 32 * MiB
    quantized = LlamaCppOptions(n_gpu_layers=-1, n_ctx=2048, parallel=2, type_k="q8_0", type_v="q8_0")
    q8 = await LlamaCppBackend(config, quantized, ON_A_GPU).estimate_memory()
    f16_kv = kv_cache_bytes(shape, 4096)
    assert q8.gpu_bytes == estimate.gpu_bytes - f16_kv + kv_cache_bytes(shape, 4096, "q8_0", "q8_0")
    engine = LlamaServerOptions(gpu_layers=-1, context_length=2048, binary="llama-server", parallel=2, type_k="q8_0")
    served = await LlamaServerBackend(config, engine, ON_A_GPU).estimate_memory()
    assert served.gpu_bytes == estimate.gpu_bytes - f16_kv + kv_cache_bytes(shape, 4096, "q8_0")


async def test_vllm_takes_its_share_of_each_gpu_it_runs_on(tmp_path: Path) -> None:
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x" * 1000)
    gpus = [GpuMemory("cuda:0", 80 * GiB, 80 * GiB), GpuMemory("cuda:1", 40 * GiB, 40 * GiB)]
    config = ModelConfig(id="v", backend="vllm_serve", source=str(weights))

    def backend(seen: list[GpuMemory], **options: object) -> VllmServeBackend:
        return VllmServeBackend(config, VllmOptions.model_validate(options), BackendContext(gpus=lambda: seen))

    assert (await backend(gpus).estimate_memory()).gpu_bytes == int(80 * GiB * 0.9)
    two = await backend(gpus, tensor_parallel_size=2, gpu_memory_utilization=0.5).estimate_memory()
    assert two.gpu_bytes == 40 * GiB + 20 * GiB and two.ram_bytes == 2 * GiB
    sized = await backend(gpus, kv_cache_memory_bytes=GiB).estimate_memory()
    assert sized.gpu_bytes == 1000 + GiB + GiB
    hidden = await backend(gpus, env={"CUDA_VISIBLE_DEVICES": ""}).estimate_memory()
    assert hidden.gpu_bytes == 0 and hidden.ram_bytes > 4 * GiB  # the CPU build: its KV cache in RAM
    assert (await backend([]).estimate_memory()).gpu_bytes == 0


def test_parameters_count_at_the_dtype_they_load_in() -> None:
    counts = {"F32": 1_000_000, "I64": 10}
    assert parameters_at(counts, 2) == 2_000_000 + 80  # floats in bfloat16, integers as stored
    assert parameters_at(counts, None) == 4_000_000 + 80


def test_gpu_gauges_and_per_model_rows(nvml_standin: Install) -> None:
    nvml_standin({"gpus": [{**one_gpu(used=GiB)["gpus"][0], "reserved": 256 * MiB}]})
    fakes = FakePool()
    fakes.slot(FakeBackend(), "cpu-model")
    memory = pool_memory(fakes.slots, fakes.capacity)
    assert [row.model for row in memory.gpu_models] == ["cpu-model"]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in MemoryGauges(lambda: memory).collect()
        for s in family.samples
    }
    gpu = (("device", "cuda:0"), ("kind", "{}"), ("name", "Stand-in H100"))
    for kind, value in (("total", 80 * GiB), ("used", GiB), ("free", 79 * GiB - 256 * MiB), ("reserved", 256 * MiB)):
        key = tuple((k, v.format(kind)) for k, v in gpu)
        assert samples[("modelpool_gpu_memory_bytes", key)] == value


async def test_an_unload_gives_pytorchs_cached_gpu_memory_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unloading any model collects its garbage, then empties PyTorch's CUDA cache when torch
    is imported and CUDA started (never starting CUDA for it)."""
    import types

    calls: list[str] = []
    cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=lambda: calls.append("empty_cache"))
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)

    def collected(*args: object) -> int:
        calls.append("gc")
        return 0

    monkeypatch.setattr("gc.collect", collected)
    fakes = FakePool()
    fakes.slot(FakeBackend(), "torch-model")
    pool = fakes.pool()
    await collect(await pool.chat("torch-model", REQUEST))
    calls.clear()
    await pool.unload("torch-model")
    assert calls == ["gc", "empty_cache"]
    cuda.is_initialized = lambda: False
    calls.clear()
    await collect(await pool.chat("torch-model", REQUEST))
    await pool.unload("torch-model")
    assert calls == ["gc"]


async def test_the_transformers_estimate_is_the_parameter_count_at_the_load_dtype() -> None:
    """SmolLM2 as a float32 safetensors folder: its parameters (counted by transformers on
    the meta device) at 2 bytes on a GPU (bfloat16, half the files' size: the old estimate
    took the files whole, twice too high) and at 4 on the CPU, + 10% and 128 MiB, + the
    batch's KV cache at its fullest; on the CPU with oneDNN's packed linears, + a packed copy
    of the tied LM head."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from modelpool.backends.textgen.hf_convert import hf_folder_for
    from modelpool.backends.transformers.backend import TransformersBackend, TransformersOptions
    from modelpool.backends.transformers.engine import BatchLimits
    from modelpool.backends.transformers.kv_budget import batch_kv_bytes, kv_shape
    from modelpool.config.sources import HubLocation

    folder = hf_folder_for(smollm2_gguf(), HubLocation.work_dir)
    with torch.device("meta"):
        params = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
    count = params.num_parameters()
    config = ModelConfig(id="hf", backend="transformers", source=str(folder))

    async def estimate(**options: str) -> MemoryEstimate:
        backend = TransformersBackend(config, TransformersOptions.model_validate(options), BackendContext())
        return await backend.estimate_memory()

    shape = kv_shape(folder)
    assert shape is not None and (shape.layers, shape.kv_heads, shape.key_length) == (30, 3, 64)

    def kv(dtype_bytes: int, max_batch_tokens: int = 32768) -> int:  # the batch's KV cache at its fullest
        assert shape is not None
        return batch_kv_bytes(shape, dtype_bytes, BatchLimits(32, max_batch_tokens, 256, 32), 8192)

    on_gpu = await estimate(device="cuda")
    assert on_gpu.gpu_bytes == int(count * 2 * 1.1) + 128 * MiB + kv(2) and on_gpu.ram_bytes == 128 * MiB
    files = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert on_gpu.gpu_bytes - kv(2) < (int(files * 1.3) + 128 * MiB) * 0.55  # the old estimate: about twice this
    assert (await estimate(device="cuda", dtype="float32")).gpu_bytes == int(count * 4 * 1.1) + 128 * MiB + kv(4)
    unpacked = await estimate(device="cpu", onednn_linear="false")
    assert unpacked.gpu_bytes == 0 and unpacked.ram_bytes == int(count * 4 * 1.1) + 128 * MiB + kv(4)
    # Packed for oneDNN (the CPU float32 default), a tied LM head gets a copy of its own.
    head = params.config.vocab_size * params.config.hidden_size
    assert params.config.tie_word_embeddings
    packed = await estimate(device="cpu")
    assert packed.gpu_bytes == 0 and packed.ram_bytes == int((count + head) * 4 * 1.1) + 128 * MiB + kv(4)
    # A smaller batch budget, a smaller estimate: the KV cache is counted at the size the engine keeps it to.
    smaller = await estimate(device="cpu", onednn_linear="false", max_batch_tokens="4096")
    assert unpacked.ram_bytes - smaller.ram_bytes == kv(4) - kv(4, max_batch_tokens=4096)
    assert kv(4) > 1.5 * 1024**3  # 45 KiB a token place: SmolLM2's batch KV outweighs its weights
    # The same from the GGUF itself (the starter's source): no `output.weight`, so the head is tied.
    config = ModelConfig(id="hf", backend="transformers", source=str(smollm2_gguf()))
    from_gguf = [(await estimate(device="cpu", onednn_linear=packs)).ram_bytes for packs in ("true", "false")]
    assert abs(from_gguf[0] - from_gguf[1] - head * 4 * 1.1) <= 1


def test_a_kv_type_is_read_as_the_options_name_it() -> None:
    from modelpool.backends.gpu_estimates import kv_type_bytes

    assert kv_type_bytes("q8_0") == 34 / 32
    assert kv_type_bytes(None) == kv_type_bytes("f16") == 2.0 and kv_type_bytes("q4_0") == 18 / 32


def test_only_the_checkpoint_transformers_loads_is_counted(tmp_path: Path) -> None:
    """A sharded checkpoint's index names its files; a `consolidated.safetensors` beside them
    (another loader's copy, as Mistral repos ship) is not counted twice."""
    import json

    from modelpool.backends.gpu_estimates import safetensors_parameters

    def write(name: str, shape: list[int]) -> None:
        header = json.dumps({"w": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}}).encode()
        (tmp_path / name).write_bytes(len(header).to_bytes(8, "little") + header)

    write("model-00001-of-00002.safetensors", [10, 10])
    write("model-00002-of-00002.safetensors", [5])
    write("consolidated.safetensors", [105])
    assert safetensors_parameters(tmp_path) == {"BF16": 210}  # no index yet: every file
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert safetensors_parameters(tmp_path) == {"BF16": 105}
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 12)  # a broken header
    assert safetensors_parameters(tmp_path) == {}  # the files' size stands in; the load will say why
