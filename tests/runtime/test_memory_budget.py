"""The memory budgets: how they are written (bytes, a share, none), what the machine gives
(RAM or a lower cgroup limit, read from fake cgroup files), the GPU probe, the start-up
line, and a budget that holds back the process's baseline and runtimes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from modelpool.config import load_config
from modelpool.config.memory_share import parse_share, share_of
from modelpool.config.schema import PoolConfig
from modelpool.runtime.build import build_pool
from modelpool.runtime.gpu_probe import nvml_gpus, probe_gpus
from modelpool.runtime.machine import MachineMemory, cgroup_limit, machine_memory
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.memory_budget import resolve_budgets, startup_lines
from modelpool.runtime.memory_ledger import Ledger
from modelpool.status import GpuMemory

GiB = 1024**3


@pytest.mark.parametrize(
    ("written", "parsed"),
    [
        ("8GiB", 8 * GiB),
        ("512MB", 512_000_000),
        (1024, 1024),
        ("75%", "75%"),
        (" 12.5 % ", "12.5%"),
        ("100%", "100%"),
        ("none", None),
        ("None", None),
        ("off", None),
        (None, None),
    ],
)
def test_a_budget_is_bytes_a_share_or_none(written: object, parsed: object) -> None:
    assert parse_share(written) == parsed


@pytest.mark.parametrize("written", ["0%", "101%", "-5%", "lots", "", 0, -1, True, [1], "8 parsecs"])
def test_a_bad_budget_is_refused_with_the_ways_to_write_one(written: object) -> None:
    with pytest.raises(ValidationError) as caught:
        PoolConfig.model_validate({"memory_budget_bytes": written})
    assert "memory budget" in str(caught.value)


def test_the_defaults_are_shares_and_the_config_turns_them_off() -> None:
    assert (PoolConfig().memory_budget_bytes, PoolConfig().gpu_memory_budget_bytes) == ("75%", "90%")
    config = load_config(environ={"MODELPOOL_POOL__MEMORY_BUDGET_BYTES": "none"}, cli={"enabled_models": []})
    assert config.pool.memory_budget_bytes is None
    assert share_of("75%", 1000) == 750 and share_of(123, 1000) == 123 and share_of(None, 1000) is None


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_cgroup_v2_limit_on_the_process_or_an_ancestor_is_read(tmp_path: Path) -> None:
    self_cgroup = write(tmp_path / "proc" / "cgroup", "0::/box/app.scope\n")
    root = tmp_path / "cg"
    write(root / "box" / "app.scope" / "memory.max", "max\n")
    write(root / "box" / "memory.max", f"{4 * GiB}\n")  # the parent's limit binds the child
    assert cgroup_limit(root, self_cgroup) == 4 * GiB
    machine = machine_memory(ram_bytes=16 * GiB, cgroup_root=root, self_cgroup=self_cgroup)
    assert machine == MachineMemory(4 * GiB, "cgroup limit")
    assert machine_memory(ram_bytes=2 * GiB, cgroup_root=root, self_cgroup=self_cgroup) == MachineMemory(2 * GiB, "RAM")


def test_a_cgroup_v1_limit_is_read_and_its_no_limit_number_ignored(tmp_path: Path) -> None:
    self_cgroup = write(tmp_path / "proc" / "cgroup", "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n")
    root = tmp_path / "cg"
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", f"{3 * GiB}\n")
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_limit(root, self_cgroup) == 3 * GiB


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_limit(tmp_path / "none", tmp_path / "no-such-file") is None
    assert machine_memory(ram_bytes=GiB, cgroup_root=tmp_path, self_cgroup=tmp_path / "x") == MachineMemory(GiB, "RAM")


def test_the_gpu_probe_finds_nothing_on_this_machine() -> None:
    # This machine has no NVIDIA driver: NVML does not load, torch (if imported) sees no CUDA.
    assert nvml_gpus() == [] and probe_gpus() == []


GPUS = [GpuMemory("cuda:0", 80 * GiB, 79 * GiB), GpuMemory("cuda:1", 80 * GiB, 80 * GiB)]


def test_the_vram_budget_is_a_share_of_the_gpus_seen_less_what_they_held_at_start() -> None:
    budgets = resolve_budgets(PoolConfig(), MachineMemory(32 * GiB, "RAM"), GPUS)
    assert budgets.ram_bytes == 24 * GiB and budgets.ram_from == "75% of 32.0 GiB of RAM"
    assert budgets.gpu_bytes == int(160 * GiB * 0.9) and budgets.gpu_from == "90% of 160.0 GiB of 2 GPUs"
    accounts = MemoryAccounts(rss=Ledger(lambda: GiB), gpus=lambda: GPUS)
    assert accounts.overhead().gpu_bytes == GiB  # what cuda:0 already held
    assert startup_lines(budgets) == [
        "memory budget 24.0 GiB (75% of 32.0 GiB of RAM); set pool.memory_budget_bytes to change it, "
        "`none` for no limit",
        "GPU memory budget 144.0 GiB (90% of 160.0 GiB of 2 GPUs); set pool.gpu_memory_budget_bytes to "
        "change it, `none` for no limit",
    ]


def test_without_a_gpu_a_share_gives_no_gpu_budget_but_bytes_still_count() -> None:
    machine = MachineMemory(8 * GiB, "cgroup limit")
    assert resolve_budgets(PoolConfig(), machine, []).gpu_bytes is None
    assert resolve_budgets(PoolConfig(gpu_memory_budget_bytes="2GiB"), machine, []).gpu_bytes == 2 * GiB
    off = resolve_budgets(PoolConfig(memory_budget_bytes="none"), machine, [])
    assert startup_lines(off) == [
        "memory budget: none (set pool.memory_budget_bytes to bytes or a share like 75% to have one)"
    ]


def test_the_server_says_its_budget_at_start_and_counts_its_baseline_in_it(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(environ={}, cli={"enabled_models": [], "pool": {"memory_budget_bytes": "50%"}})
    accounts = MemoryAccounts(rss=Ledger(lambda: GiB), gpus=list)
    with caplog.at_level(logging.INFO, logger="modelpool.runtime"):
        pool = build_pool(config, accounts=accounts, machine=MachineMemory(8 * GiB, "RAM"))
    assert (
        "memory budget 4.0 GiB (50% of 8.0 GiB of RAM); set pool.memory_budget_bytes to change it, "
        "`none` for no limit" in caplog.messages
    )
    accounts.runtimes["torch"] = GiB // 2
    memory = pool.memory()
    assert memory.budget.memory_bytes == 4 * GiB
    assert memory.budget.models_memory_bytes == 4 * GiB - GiB - GiB // 2  # baseline and runtime held back
    assert memory.runtimes == {"torch": GiB // 2} and memory.gpu is None
    assert memory.process is not None and memory.process.baseline_bytes == GiB
    gauges = pool.metrics.render().decode()
    assert 'modelpool_memory_budget_bytes{device="ram",part="total"} 4.294967296e+09' in gauges
    assert 'modelpool_runtime_memory_bytes{runtime="torch"} 5.36870912e+08' in gauges


def test_a_half_imported_torch_is_not_asked_for_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime import runs on a worker thread while the metrics sampler probes the GPUs: until
    that import ends, sys.modules holds a torch without `cuda` (seen as an AttributeError in the
    sampler). The probe treats it as not imported yet; a finished import is used."""
    import importlib.machinery
    import types

    from modelpool.runtime.gpu_probe import torch_gpus
    from modelpool.runtime.memory import imported_torch

    half = types.ModuleType("torch")
    half.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", half)
    assert imported_torch() is None
    assert torch_gpus() == []

    finished = types.ModuleType("torch")
    finished.cuda = types.SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", finished)
    assert imported_torch() is finished
    assert torch_gpus() == []
