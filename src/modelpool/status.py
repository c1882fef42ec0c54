"""Typed snapshots of the pool that the runtime builds and the API only renders: the API never
reaches into slots, replicas or backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from modelpool.capabilities import ModelCapabilities


@dataclass(frozen=True)
class GpuMemory:
    device: str
    """`cuda:<index>`, as PyTorch and the configs name it."""
    total_bytes: int
    free_bytes: int
    used_bytes: int = -1
    """As nvidia-smi's memory.used counts it (NVML's v2 memory info: the driver's reserved
    memory is not in it, see `reserved_bytes`); -1: total - free."""
    index: int = 0
    name: str = ""
    """The GPU's product name ("NVIDIA H100 80GB HBM3"); empty when only PyTorch saw it."""
    uuid: str = ""
    reserved_bytes: int = 0
    """What the driver reserves for itself (NVML's v2 memory info; total = used + reserved +
    free). 0 when unknown: an old driver answering only v1 (its used includes it) or PyTorch."""

    def __post_init__(self) -> None:
        if self.used_bytes < 0:
            object.__setattr__(self, "used_bytes", self.total_bytes - self.free_bytes)


@dataclass(frozen=True)
class GpuProcess:
    """One process's use of the GPUs, from NVML's per-process lists."""

    pid: int
    used_bytes: int
    devices: tuple[str, ...]


@dataclass(frozen=True)
class ReplicaStatus:
    index: int
    running: int
    served: int
    memory_bytes: int
    retiring: bool
    pid: int | None = None
    """Engine processes only."""
    port: int | None = None
    node_id: str | None = None
    """Ray mode: the Ray node the replica runs on."""
    node_ip: str | None = None
    """Ray mode: that node's address."""
    ray_replica: str | None = None
    """Ray mode: the Ray Serve replica's id."""
    placement: dict[str, str] | None = None
    """In-process PyTorch models: where the weights sit (module → device; `device_map: auto`
    spreads them over devices)."""


@dataclass(frozen=True)
class MemoryStatus:
    estimate_bytes: int | None
    estimate_gpu_bytes: int | None
    measured_bytes: int
    counted_bytes: int
    """What the pool's budget counts: measured when loaded, else configured or estimated."""
    counted_gpu_bytes: int
    measured_gpu_bytes: int = 0
    """Its share of the GPUs' growth while it loaded (0 without a GPU)."""


@dataclass(frozen=True)
class ReplicaGpu:
    """One replica's GPU memory: measured, and how."""

    replica: int
    measured_bytes: int
    source: str
    """`nvml`: its engine processes' use in NVML's per-process list, now; `load`: its share of
    the GPUs' growth while it loaded in modelpool's process (an in-process model: NVML
    cannot tell models in one process apart); `none`: nothing measured (no GPU use seen)."""
    pids: tuple[int, ...] = ()
    """The processes NVML lists with GPU memory (the engine and its children; modelpool's own
    for an in-process model)."""
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelGpu:
    """A model's row in `/v1/admin/gpu-memory`: per replica, what it was estimated to need on
    the GPUs before it loaded and what it holds."""

    model: str
    state: str
    estimate_bytes: int | None
    """Per replica, judged from its files and options before the load (None: never judged)."""
    counted_bytes: int
    """What the GPU budget counts for the whole model (measured when loaded, else estimated)."""
    replicas: list[ReplicaGpu] = field(default_factory=list)


@dataclass(frozen=True)
class OverrideOption:
    """One option a load may override (`POST /v1/admin/models/{id}/load` `overrides`)."""

    name: str
    schema: dict[str, Any]
    """The option's JSON schema, flattened: `type`, bounds (`minimum`, `maximum`,
    `exclusiveMinimum`, `exclusiveMaximum`), `enum`, `default`, `description`, and
    `nullable: true` for an Optional field. Empty when the backend does not declare the field."""
    value: Any
    """What the model uses now (its config with any overrides, defaults filled in)."""


@dataclass(frozen=True)
class DownloadStatus:
    """A model's weights being fetched from the hub before it loads (state `downloading`)."""

    done_bytes: int
    total_bytes: int
    file: str | None
    """The repo file being fetched now."""
    seconds: float
    """Since the download started."""

    @property
    def percent(self) -> float:
        return round(100.0 * self.done_bytes / self.total_bytes, 1) if self.total_bytes else 0.0


@dataclass(frozen=True)
class ModelStatus:
    id: str
    created: int
    state: str
    backend: str
    capabilities: ModelCapabilities
    aliases: list[str]
    description: str
    owned_by: str
    replicas: list[ReplicaStatus]
    replicas_wanted: int
    replica_max: int
    in_flight: int
    queued: int
    max_concurrency: int | None
    max_queue: int
    memory: MemoryStatus
    keep_alive_s: float
    expires_in_s: float | None
    pinned: bool
    autoload: bool
    loaded_at: float | None
    load_seconds: float | None
    last_error: str | None
    crashes_in_a_row: int
    allow_remote: bool
    options: dict[str, Any]
    """Backend options, secrets redacted."""
    overridable: list[str]
    override_options: list[OverrideOption] = field(default_factory=list)
    """`overridable` with each option's schema and current value (for forms)."""
    dimensions: int | None = None
    """An embedding model's vector size, once its vectors have shown it (None before)."""
    replicas_by_node: dict[str, int] = field(default_factory=dict)
    """Ray mode: running replicas per Ray node id."""
    download: DownloadStatus | None = None
    """While the weights download (then `state` is "downloading")."""
    queued_by_priority: dict[str, int] = field(default_factory=dict)
    """`queued` by priority class (high, normal, low)."""
    adapters: list[str] = field(default_factory=list)
    """The model's LoRA adapters by name (its config's `adapters:`), each served as `<id>:<name>`."""
    adapters_loaded: list[str] = field(default_factory=list)
    """Those held in memory now (by the first replica), least recently used first."""
    reload_pending: bool = False
    """A config reload changed a field that needs the model loaded again: it keeps its old
    config until its next idle moment, then takes the new one (see docs/configuration.md)."""


@dataclass(frozen=True)
class EngineOutput:
    replica: int
    pid: int | None
    lines: list[str]


@dataclass(frozen=True)
class EngineLogs:
    model: str
    state: str
    processes: list[EngineOutput]
    last_crash_error: str | None = None
    last_crash_lines: list[str] = field(default_factory=list)
    """The last output of the process that crashed last (empty: none crashed)."""


@dataclass(frozen=True)
class BudgetStatus:
    max_loaded_models: int | None
    memory_bytes: int | None
    """All the RAM modelpool may use: baseline, runtimes and models (None: no limit)."""
    gpu_memory_bytes: int | None
    models_memory_bytes: int | None = None
    """What is left of memory_bytes for models after the process's baseline and runtimes."""
    models_gpu_memory_bytes: int | None = None
    """What is left of gpu_memory_bytes after what the GPUs held when modelpool started."""
    memory_from: str = ""
    """How memory_bytes was reached ("75% of 23.5 GiB of RAM", "set to 8.0 GiB", "no limit")."""
    gpu_memory_from: str = ""


@dataclass(frozen=True)
class ModelMemory:
    state: str
    memory_bytes: int
    """What the budget counts (measured once loaded, else configured or estimated)."""
    measured_bytes: int
    """Its share of the process's growth while it loaded, or its engine processes' RSS."""
    estimate_bytes: int | None = None
    gpu_memory_bytes: int = 0
    """What the GPU budget counts."""
    measured_gpu_bytes: int = 0
    estimate_gpu_bytes: int | None = None
    adapters_bytes: int = 0
    """LoRA adapters its replicas hold now (their files' size; within the estimate, which counts
    the `max_adapters` largest)."""
    locality: str = "in_process"
    """Where it runs: `in_process` (its memory is in process.models_bytes), `engine_process`
    (its own process's RSS, outside modelpool's) or `remote` (none here)."""


@dataclass(frozen=True)
class ProcessMemory:
    """modelpool's own process, its RSS taken apart. The parts add up: runtimes + models +
    unattributed = growth since the baseline."""

    rss_bytes: int
    baseline_bytes: int
    """RSS when the pool was built (Python, modelpool, its libraries)."""
    growth_bytes: int
    """rss_bytes - baseline_bytes."""
    runtimes_bytes: int
    """The first imports of the engines' shared runtimes (torch, onnxruntime, ...), once each."""
    models_bytes: int
    """The loaded in-process models' measured memory."""
    unattributed_bytes: int
    """The rest of the growth: request buffers, caches, memory the allocator keeps after an
    unload (negative when the RSS fell below what was attributed, e.g. pages swapped out)."""
    engine_processes_bytes: int = 0
    """The engine processes' RSS (outside this process, counted by the budget too)."""


@dataclass(frozen=True)
class GpuAccount:
    """The GPUs' memory as modelpool accounts for it."""

    used_at_start_bytes: int
    """In use on the visible GPUs when modelpool started (by anyone)."""
    used_bytes: int
    models_bytes: int
    """The loaded models' measured share of the GPUs' growth."""
    runtimes_bytes: int = 0
    """What runtimes hold on the GPUs once per process (PyTorch's CUDA context)."""


@dataclass(frozen=True)
class PoolMemory:
    system: dict[str, int]
    gpus: list[GpuMemory]
    budget: BudgetStatus
    models: dict[str, ModelMemory]
    process: ProcessMemory | None = None
    """None where the pool is not one process (Ray mode)."""
    runtimes: dict[str, int] = field(default_factory=dict)
    """Runtime (top-level module) → what its first import cost the process."""
    gpu: GpuAccount | None = None
    """None without a GPU."""
    gpu_models: list[ModelGpu] = field(default_factory=list)
    """Each model holding (or about to hold) GPU memory, by replica; empty without a GPU."""


class MetricsHistoryView(Protocol):
    """The pool's recent metrics, one point per interval (the runtime's `MetricsHistory`),
    as the charts read them."""

    def as_json(self, since: float | None = None) -> dict[str, Any]: ...
