"""GPU memory accounting, checked by hand on a machine with an NVIDIA GPU (no internet
needed): run from the repository root with

    PYTHONPATH=src python scripts/gpu_memory_check.py

It (1) probes the GPUs through NVML, (2) computes the default VRAM budget (90% of the
GPUs' memory, less what was in use at start), (3) writes a random 8-layer Llama (~105 M
parameters) with a byte-level BPE tokenizer next to this script (once; reused after),
(4) loads it through the pool as two models at once on cuda (transformers backend), chats
once, then unloads one, and (5) prints one JSON summary: what NVML and torch saw, the
budget, each model's measured GPU memory, PyTorch's CUDA context counted once as a
runtime, and whether the parts add up. Exit status 1 when a check fails. About a minute
on an H100/H200 (most of it building the model the first time).

Needs: CUDA PyTorch, transformers and tokenizers (the `transformers` extra).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODEL_DIR = Path(__file__).resolve().parent / "gpu_memory_check_model"
MiB = 1024 * 1024
DRIFT = 64 * MiB
"""What NVML may see move between a load's end and the reading (allocator caches, other processes)."""
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer() -> Any:
    """A byte-level BPE tokenizer (1024 tokens, ChatML specials) trained here: no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [f"The GPU memory check number {i} says hello to the pool and its models." for i in range(200)]
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it untyped
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    fast.chat_template = CHATML
    return fast


def build_model(folder: Path) -> Path:
    """A seeded random Llama and a tokenizer trained here: no download, same bytes every run."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = train_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    fast.save_pretrained(partial)
    partial.rename(folder)
    return folder


async def check(folder: Path, device: str) -> dict[str, Any]:
    from modelpool.config import load_config
    from modelpool.inference import ChatMessage, ChatRequest, SamplingParams
    from modelpool.pool_api.generation import collect
    from modelpool.runtime.build import build_pool
    from modelpool.runtime.gpu_probe import nvml_gpus, probe_gpus
    from modelpool.runtime.machine import machine_memory
    from modelpool.runtime.memory_budget import resolve_budgets

    entry = {"backend": "transformers", "source": str(folder), "tasks": ["chat", "completion"], "preload": False,
             "options": {"device": device, "max_model_len": 512, "max_batch_size": 4}}  # fmt: skip
    config = load_config(
        environ={}, cli={"models": {"gpu-a": entry, "gpu-b": entry}, "enabled_models": ["gpu-a", "gpu-b"]}
    )
    nvml, probed = nvml_gpus(), probe_gpus()
    budgets = resolve_budgets(config.pool, machine_memory(), nvml)
    pool = build_pool(config)
    started = time.monotonic()
    await asyncio.gather(pool.load("gpu-a"), pool.load("gpu-b"))  # measured at once: shares must add up
    load_s = time.monotonic() - started
    reply = await collect(
        await pool.chat(
            "gpu-a", ChatRequest((ChatMessage("user", "Hello GPU"),), SamplingParams(max_tokens=8, temperature=0))
        )
    )
    loaded = pool.memory()
    torch_loaded = torch_memory()
    await pool.unload("gpu-a")
    after_unload = pool.memory()
    await pool.close()
    result = summary(nvml, probed, budgets, loaded, after_unload, load_s, reply.text)
    result["torch_while_both_loaded"] = torch_loaded
    return result


def torch_memory() -> dict[str, Any]:
    import torch

    cuda = torch.cuda
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "allocated_bytes": cuda.memory_allocated(), "reserved_bytes": cuda.memory_reserved()}  # fmt: skip


def summary(nvml: list[Any], probed: list[Any], budgets: Any, loaded: Any, after: Any, load_s: float,
            reply: str) -> dict[str, Any]:  # fmt: skip
    gpu = loaded.gpu
    models = {name: {"measured_gpu_bytes": m.measured_gpu_bytes, "estimate_gpu_bytes": m.estimate_gpu_bytes,
                     "measured_ram_bytes": m.measured_bytes} for name, m in loaded.models.items()}  # fmt: skip
    params = 105_000_000 * 2  # bfloat16 on a GPU (dtype auto)
    problems = []
    if not nvml:
        problems.append("NVML saw no GPU")
    if budgets.gpu_bytes is None:
        problems.append("no default GPU budget")
    if gpu is None:
        problems.append("the pool keeps no GPU account")
    else:
        grown = gpu.used_bytes - gpu.used_at_start_bytes
        if gpu.models_bytes + gpu.runtimes_bytes > grown + DRIFT:
            problems.append(f"models {gpu.models_bytes} + runtimes {gpu.runtimes_bytes} > GPU growth {grown}")
        if gpu.runtimes_bytes <= 0:
            problems.append("the CUDA context was not counted as torch's runtime")
    for name, model in models.items():
        if not 0.5 * params <= model["measured_gpu_bytes"] <= 4 * params:
            problems.append(f"{name}: measured {model['measured_gpu_bytes']} B on the GPU for ~{params} B of weights")
    if after.gpu is not None and gpu is not None:
        if after.gpu.models_bytes >= gpu.models_bytes:
            problems.append("unloading gpu-a did not lower the models' GPU memory")
        if after.gpu.used_bytes > gpu.used_bytes - models["gpu-a"]["measured_gpu_bytes"] // 2:
            problems.append("unloading gpu-a did not give its GPU memory back to the driver")
    return {
        "ok": not problems,
        "problems": problems,
        "nvml_gpus": [vars(g) for g in nvml],
        "probe_gpus": [vars(g) for g in probed],
        "default_budgets": {
            "ram_bytes": budgets.ram_bytes,
            "ram_from": budgets.ram_from,
            "gpu_bytes": budgets.gpu_bytes,
            "gpu_from": budgets.gpu_from,
        },
        "budget_for_models": {
            "ram_bytes": loaded.budget.models_memory_bytes,
            "gpu_bytes": loaded.budget.models_gpu_memory_bytes,
        },
        "gpu_account": vars(gpu) if gpu else None,
        "gpu_account_after_unloading_gpu_a": vars(after.gpu) if after.gpu else None,
        "runtimes_ram": loaded.runtimes,
        "process": vars(loaded.process) if loaded.process else None,
        "models": models,
        "load_both_s": round(load_s, 2),
        "reply": reply,
    }


def main() -> int:
    if "--build-only" in sys.argv:
        build_model(MODEL_DIR)
        return 0
    started = time.monotonic()
    try:
        # Built in a child process: this one must start with no torch and no CUDA context,
        # as a server does, so the context is measured as torch's runtime.
        subprocess.run([sys.executable, __file__, "--build-only"], check=True)
        folder = MODEL_DIR
        # `--device cpu`: a dry run of everything but the GPU (its checks then fail, saying so).
        device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
        result = asyncio.run(check(folder, device))
    except Exception as exc:  # one JSON line whatever happens: the lead reads it
        result = {"ok": False, "problems": [f"{type(exc).__name__}: {exc}"]}
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
