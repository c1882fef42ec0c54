"""The GPU checks of issue 32, one function each, run by scripts/gpu_check.sh on a machine
with an NVIDIA GPU (no network needed) after it installed modelpool's missing wheels and
built llama-cpp-python for CUDA:

    PYTHONPATH=src python scripts/gpu_check.py --out DIR [--only NAME ...] [--dry-run]

Each check runs in a child process of its own (a fresh CUDA context: one check's memory
never shows in another's numbers, and a crash in a CUDA library fails that check only) and
reports pass, fail or skip with the numbers it saw. `DIR/gpu_check.json` and
`DIR/gpu_check.md` hold the report; the exit status is 1 when a check failed. Without a
GPU (no `nvidia-smi`, or NVML sees none) or with `--dry-run`, every check is reported as
skipped and the exit status is 0: tests/scripts run it so on the CPU to keep it working.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
MiB = 1024 * 1024
CHECK_TIMEOUT_S = 300
SMI_DRIFT_MIB = 64
"""How far NVML's and nvidia-smi's readings of used memory may be apart: they are read
moments apart, and other processes (the driver's own) may move meanwhile."""


@dataclass
class Result:
    status: str
    """pass, fail or skip."""
    detail: str
    numbers: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class Check:
    name: str
    what: str
    run: Callable[[Path], Awaitable[Result]]


CHECKS: dict[str, Check] = {}


def check(name: str, what: str) -> Callable[[Callable[[Path], Awaitable[Result]]], Callable[[Path], Awaitable[Result]]]:
    def register(function: Callable[[Path], Awaitable[Result]]) -> Callable[[Path], Awaitable[Result]]:
        CHECKS[name] = Check(name, what, function)
        return function

    return register


def passed(detail: str, **numbers: Any) -> Result:
    return Result("pass", detail, numbers)


def failed(detail: str, **numbers: Any) -> Result:
    return Result("fail", detail, numbers)


def skipped(detail: str, **numbers: Any) -> Result:
    return Result("skip", detail, numbers)


def verdict(problems: list[str], ok: str, **numbers: Any) -> Result:
    return failed("; ".join(problems), **numbers) if problems else passed(ok, **numbers)


# --- readings shared by the checks -------------------------------------------------------


def smi(*query: str) -> list[list[str]]:
    """nvidia-smi's CSV rows (no header, no units)."""
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30, check=True).stdout  # fmt: skip
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def my_gpu_bytes(pids: list[int] | None = None) -> int:
    """What these processes (default: this one) hold on the GPUs, as NVML sees it."""
    from modelpool.runtime.gpu_probe import nvml_processes

    seen = nvml_processes()
    return sum(seen[pid].used_bytes for pid in (pids or [os.getpid()]) if pid in seen)


def random_gguf(work: Path) -> Path:
    from gpu_check_gguf import write_llama_gguf

    return write_llama_gguf(work / "random-llama-f16.gguf")


def hf_llama(work: Path) -> Path:
    """gpu_memory_check's random Llama (~105 M parameters), built once in a child process."""
    from gpu_memory_check import MODEL_DIR

    subprocess.run([sys.executable, str(SCRIPTS / "gpu_memory_check.py"), "--build-only"], check=True)
    return MODEL_DIR


def pool_for(models: dict[str, dict[str, Any]], work: Path) -> Any:
    from modelpool.config import load_config
    from modelpool.runtime.build import build_pool

    cli = {"models": models, "enabled_models": list(models), "work_dir": str(work)}
    return build_pool(load_config(environ={}, cli=cli))


async def greedy(pool: Any, model: str, text: str = "Hello GPU", max_tokens: int = 16) -> str:
    from modelpool.inference import ChatMessage, ChatRequest, SamplingParams
    from modelpool.pool_api.generation import collect

    request = ChatRequest((ChatMessage("user", text),), SamplingParams(max_tokens=max_tokens, temperature=0))
    return str((await collect(await pool.chat(model, request))).text)


def backend_of(pool: Any, model: str) -> Any:
    return pool.slot(model).replicas.members[0].backend


# --- the checks ----------------------------------------------------------------------------


@check("nvml_vs_nvidia_smi", "NVML through modelpool's probe: each GPU's total, used and UUID equal nvidia-smi's")
async def nvml_vs_nvidia_smi(work: Path) -> Result:
    from modelpool.runtime.gpu_probe import nvml_gpus

    query = "--query-gpu=index,uuid,memory.total,memory.used"
    first = {int(row[0]): row for row in smi(query)}
    gpus = nvml_gpus()
    last = {int(row[0]): row for row in smi(query)}  # NVML's reading lies between these two
    problems, numbers = [], {}
    if len(gpus) != len(first):
        problems.append(f"NVML sees {len(gpus)} GPUs, nvidia-smi {len(first)}")
    for gpu in gpus:
        if gpu.index not in first or gpu.index not in last:
            problems.append(f"{gpu.device}: not in nvidia-smi's list")
            continue
        (_, uuid, total, used), (*_, used_after) = first[gpu.index], last[gpu.index]
        low, high = sorted((int(used), int(used_after)))
        mine = (gpu.total_bytes // MiB, gpu.used_bytes // MiB)
        numbers[gpu.device] = {"name": gpu.name, "nvml_total_mib": mine[0], "smi_total_mib": int(total),
                               "nvml_used_mib": mine[1], "smi_used_mib": [low, high], "uuid": gpu.uuid,
                               "nvml_reserved_mib": gpu.reserved_bytes // MiB}  # fmt: skip
        if abs(mine[0] - int(total)) > 1:
            problems.append(f"{gpu.device}: total {mine[0]} MiB by NVML, {total} by nvidia-smi")
        if not low - 1 <= mine[1] <= high + 1:
            problems.append(f"{gpu.device}: used {mine[1]} MiB by NVML, {low}..{high} by nvidia-smi around it")
        if uuid != gpu.uuid:
            problems.append(f"{gpu.device}: UUID {gpu.uuid} by NVML, {uuid} by nvidia-smi")
    return verdict(problems, "totals, used (within 1 MiB) and UUIDs equal", **numbers)


@check("nvml_per_process", "NVML per-process memory (modelpool's nvml_processes) equals nvidia-smi's compute apps")
async def nvml_per_process(work: Path) -> Result:
    import torch

    block = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    mine = my_gpu_bytes() // MiB
    apps = {int(row[0]): int(row[1]) for row in smi("--query-compute-apps=pid,used_memory") if row[0].isdigit()}
    theirs = apps.get(os.getpid())
    del block
    numbers = {"pid": os.getpid(), "nvml_mib": mine, "smi_mib": theirs, "smi_pids": sorted(apps)}
    if theirs is None:
        return failed("nvidia-smi lists no compute process with this PID (another PID namespace?)", **numbers)
    problems = [f"NVML {mine} MiB, nvidia-smi {theirs} MiB"] if abs(mine - theirs) > 2 else []
    if mine < 256:
        problems.append(f"a 256 MiB tensor, but NVML says the process holds {mine} MiB")
    return verdict(problems, "equal, the tensor counted", **numbers)


@check("llama_cpp_cuda", "in-process llama.cpp engine on CUDA (n_gpu_layers -1): greedy answers repeat, "
       "batch_invariant off by default on GPU, VRAM measured and freed on unload")  # fmt: skip
async def llama_cpp_cuda(work: Path) -> Result:
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return failed("llama-cpp-python was built without GPU offload (see llama_build.log)")
    gguf = random_gguf(work)
    entry = {"backend": "llama_cpp", "source": str(gguf), "tasks": ["chat", "completion"],
             "options": {"n_gpu_layers": -1, "n_ctx": 1024}}  # fmt: skip
    pool = pool_for({"llama-gpu": entry}, work)
    before = my_gpu_bytes()
    try:
        await pool.load("llama-gpu")
        loaded = my_gpu_bytes()
        options = backend_of(pool, "llama-gpu").options
        first, second = await greedy(pool, "llama-gpu"), await greedy(pool, "llama-gpu")
        measured = pool.memory().models["llama-gpu"].measured_gpu_bytes
        await pool.unload("llama-gpu")
        after = my_gpu_bytes()
    finally:
        await pool.close()
    weights = gguf.stat().st_size
    numbers = {"weights_mib": weights // MiB, "before_mib": before // MiB, "loaded_mib": loaded // MiB,
               "after_unload_mib": after // MiB, "measured_gpu_mib": measured // MiB,
               "batch_invariant": options.invariant, "reply": first}  # fmt: skip
    problems = []
    if options.invariant:
        problems.append("batch_invariant is on by default with n_gpu_layers -1 (documented: off on GPU)")
    if not first or first != second:
        problems.append(f"greedy answers differ or are empty: {first!r} / {second!r}")
    if loaded - before < weights // 2:
        problems.append(f"the load grew the process's GPU memory by {(loaded - before) // MiB} MiB only")
    if measured < weights // 2:
        problems.append(f"the pool measured {measured // MiB} MiB on the GPU for {weights // MiB} MiB of weights")
    if loaded - after < weights * 9 // 10:
        problems.append(f"unloading gave back {(loaded - after) // MiB} MiB of {weights // MiB} MiB of weights")
    return verdict(problems, "served on CUDA, freed on unload (the CUDA context stays)", **numbers)


@check("llama_server_cuda", "llama_server engine (llama-cpp-python's server, the CUDA build) with gpu_layers -1: "
       "answers, its VRAM measured by PID, gone on unload")  # fmt: skip
async def llama_server_cuda(work: Path) -> Result:
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return failed("llama-cpp-python was built without GPU offload (see llama_build.log)")
    gguf = random_gguf(work)
    entry = {"backend": "llama_server", "source": str(gguf), "tasks": ["chat", "completion"],
             "options": {"gpu_layers": -1, "context_length": 1024}}  # fmt: skip
    pool = pool_for({"server-gpu": entry}, work)
    try:
        await pool.load("server-gpu")
        reply = await greedy(pool, "server-gpu")
        memory = pool.memory()
        measured = memory.models["server-gpu"].measured_gpu_bytes
        row = next((m for m in memory.gpu_models if m.model == "server-gpu"), None)
        pids = [r.pid for r in pool.slot("server-gpu").status().replicas if r.pid]
        apps = {int(r[0]): int(r[1]) for r in smi("--query-compute-apps=pid,used_memory") if r[0].isdigit()}
        engine = my_gpu_bytes(pids)
        await pool.unload("server-gpu")
        after = my_gpu_bytes(pids)
    finally:
        await pool.close()
    return _engine_verdict(gguf.stat().st_size, reply, measured, row, pids, apps, engine, after)


def _engine_verdict(weights: int, reply: str, measured: int, row: Any, pids: list[int], apps: dict[int, int],
                    engine: int, after: int) -> Result:  # fmt: skip
    """An engine process's VRAM: the pool's /v1/admin/gpu-memory row against nvidia-smi."""
    replica = row.replicas[0] if row is not None and row.replicas else None
    row_pids = list(replica.pids) if replica else []
    smi_mib = sum(apps.get(pid, 0) for pid in row_pids)
    numbers = {"weights_mib": weights // MiB, "engine_pids": pids, "row_pids": row_pids,
               "row_source": replica.source if replica else None, "measured_gpu_mib": measured // MiB,
               "row_measured_mib": replica.measured_bytes // MiB if replica else None, "smi_mib_for_row_pids": smi_mib,
               "estimate_mib": row.estimate_bytes // MiB if row and row.estimate_bytes else None,
               "engine_nvml_mib": engine // MiB, "after_unload_mib": after // MiB, "reply": reply}  # fmt: skip
    problems = []
    if not reply:
        problems.append("no answer")
    if measured < weights // 2:
        problems.append(f"the pool measured {measured // MiB} MiB for {weights // MiB} MiB of weights")
    if replica is None or replica.source != "nvml":
        problems.append(f"the gpu-memory row's source is {replica.source if replica else 'missing'}, not nvml")
    elif not set(pids) <= set(row_pids):
        problems.append(f"the row's PIDs {row_pids} miss the engine's {pids}")
    elif abs(replica.measured_bytes // MiB - smi_mib) > 1:
        problems.append(f"the row measured {replica.measured_bytes // MiB} MiB, nvidia-smi lists {smi_mib} MiB")
    if after:
        problems.append(f"{after // MiB} MiB still held by the engine's PIDs after unload")
    return verdict(problems, "engine on CUDA, measured by PID as nvidia-smi says, gone on unload", **numbers)


@check("llama_cpp_kv_q8_flash_attention", "in-process llama.cpp on CUDA with q8_0 K/V caches and flash attention "
       "on, then auto (CUDA's FA kernels): greedy answers")  # fmt: skip
async def llama_cpp_kv_q8_flash_attention(work: Path) -> Result:
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return failed("llama-cpp-python was built without GPU offload (see llama_build.log)")
    gguf, replies = random_gguf(work), {}
    for mode in ("on", "auto"):
        entry = {"backend": "llama_cpp", "source": str(gguf), "tasks": ["chat", "completion"],
                 "options": {"n_gpu_layers": -1, "n_ctx": 1024, "type_k": "q8_0", "type_v": "q8_0",
                             "flash_attention": mode}}  # fmt: skip
        pool = pool_for({"kv-q8": entry}, work)
        try:
            replies[mode] = await greedy(pool, "kv-q8")
        finally:
            await pool.close()
    problems = [f"flash_attention {mode}: no answer" for mode, reply in replies.items() if not reply]
    return verdict(problems, "q8_0 caches with flash attention on and auto answered", replies=replies)


@check("llama_cpp_speculative_cuda", "in-process llama.cpp on CUDA with a draft model (the same GGUF, all layers "
       "on the GPU): loads, acceptance over 0.8, draft weights on the GPU; text vs no draft reported")  # fmt: skip
async def llama_cpp_speculative_cuda(work: Path) -> Result:
    import llama_cpp

    from modelpool.backends.llama_cpp.backend import LlamaCppOptions
    from modelpool.inference import ChatMessage, ChatRequest, SamplingParams

    if "speculative" not in LlamaCppOptions.model_fields:
        return skipped("this modelpool's llama_cpp backend has no `speculative` option")
    if not llama_cpp.llama_supports_gpu_offload():
        return failed("llama-cpp-python was built without GPU offload (see llama_build.log)")
    gguf, texts, grown, speculation = random_gguf(work), {}, {}, None
    draft = {"draft": str(gguf), "n_max": 8, "p_min": 0.0, "n_gpu_layers": -1}  # itself: every guess holds
    request = ChatRequest((ChatMessage("user", "Hello GPU"),), SamplingParams(max_tokens=64, temperature=0))
    for name, extra in (("plain", {}), ("drafted", {"speculative": draft})):
        entry = {"backend": "llama_cpp", "source": str(gguf), "tasks": ["chat", "completion"],
                 "options": {"n_gpu_layers": -1, "n_ctx": 1024, **extra}}  # fmt: skip
        pool = pool_for({name: entry}, work)
        try:
            before = my_gpu_bytes()
            await pool.load(name)
            grown[name] = my_gpu_bytes() - before
            chunks = [chunk async for chunk in await pool.chat(name, request)]
            texts[name] = "".join(chunk.text for chunk in chunks)
            speculation = next((c.speculation for c in chunks if getattr(c, "speculation", None)), speculation)
        finally:
            await pool.close()
    return _speculation_verdict(gguf.stat().st_size, texts, grown, speculation)


def _speculation_verdict(weights: int, texts: dict[str, str], grown: dict[str, int], speculation: Any) -> Result:
    drafted, accepted = (speculation.drafted, speculation.accepted) if speculation else (0, 0)
    acceptance = round(accepted / drafted, 3) if drafted else None
    numbers = {"weights_mib": weights // MiB, "grown_mib": {k: v // MiB for k, v in grown.items()},
               "drafted": drafted, "accepted": accepted, "acceptance": acceptance,
               "same_text_as_without_draft": texts["plain"] == texts["drafted"], "texts": texts}  # fmt: skip
    problems = []  # the text is reported, not judged: CUDA's kernels are not batch-invariant (a near tie may flip)
    if not texts["drafted"]:
        problems.append("no answer with a draft")
    if not drafted:
        problems.append("no speculation reported on the last chunk")
    elif accepted <= drafted * 0.8:
        problems.append(f"the target itself as draft: only {accepted} of {drafted} guesses accepted")
    if grown.get("drafted", 0) - grown.get("plain", 0) < weights * 8 // 10:
        problems.append(f"with the draft the load took {numbers['grown_mib']} MiB: the draft's weights not on the GPU")
    return verdict(problems, "speculative decoding on CUDA: draft on the GPU, guesses accepted", **numbers)


@check("llama_server_native_draft", "llama.cpp's native llama-server (CUDA) with a draft model on the GPU: answers, "
       "and its log shows the draft loaded with no ignored option")  # fmt: skip
async def llama_server_native_draft(work: Path) -> Result:
    binary = os.environ.get("LLAMA_SERVER_BINARY") or shutil.which("llama-server")
    if binary is None:
        return skipped("no native llama-server binary (LLAMA_SERVER_BINARY or PATH): this check builds "
                       "llama-cpp-python only, whose server has no draft-model flags")  # fmt: skip
    gguf = random_gguf(work)
    options = {"binary": binary, "gpu_layers": -1, "draft_model": str(gguf), "draft_gpu_layers": -1,
               "draft_max_tokens": 8, "flash_attention": "on", "type_v": "q8_0", "context_length": 1024}  # fmt: skip
    entry = {"backend": "llama_server", "source": str(gguf), "tasks": ["chat", "completion"], "options": options}
    pool = pool_for({"drafted": entry}, work)
    try:
        await pool.load("drafted")
        reply = await greedy(pool, "drafted")
        log = "\n".join(backend_of(pool, "drafted").log_tail(400))
    finally:
        await pool.close()
    problems = [] if reply else ["no answer"]
    if "will be ignored" in log:
        problems.append("llama-server ignored an option (a build without GPU support?)")
    return verdict(problems, "answered with a draft model on the GPU", reply=reply, log_tail=log[-1500:])


@check("transformers_unload_frees_vram", "transformers on cuda: after unload the GPU's used memory is back within "
       "50 MiB of before the load (CUDA context made first: it stays)")  # fmt: skip
async def transformers_unload_frees_vram(work: Path) -> Result:
    import torch

    from modelpool.runtime.gpu_probe import nvml_gpus

    folder = hf_llama(work)
    torch.zeros(1, device="cuda")  # the CUDA context first: what stays after an unload
    before = nvml_gpus()[0].used_bytes
    entry = {"backend": "transformers", "source": str(folder), "tasks": ["chat", "completion"],
             "options": {"device": "cuda", "max_model_len": 512}}  # fmt: skip
    pool = pool_for({"freed": entry}, work)
    try:
        await pool.load("freed")
        loaded = nvml_gpus()[0].used_bytes
        reply = await greedy(pool, "freed")
        await pool.unload("freed")
        after = nvml_gpus()[0].used_bytes
        reported = pool.memory().gpus[0].used_bytes if pool.memory().gpus else None
    finally:
        await pool.close()
    numbers = {"before_mib": before // MiB, "loaded_mib": loaded // MiB, "after_unload_mib": after // MiB,
               "pool_reports_used_mib": reported // MiB if reported is not None else None, "reply": reply}  # fmt: skip
    problems = []
    if loaded - before < 100 * MiB:
        problems.append(f"the load took only {(loaded - before) // MiB} MiB on the GPU")
    if after - before > 50 * MiB:
        problems.append(f"{(after - before) // MiB} MiB more in use after the unload than before the load")
    if reported is not None and abs(reported - after) > 8 * MiB:
        problems.append(f"the pool reports {reported // MiB} MiB used, NVML {after // MiB} MiB")
    return verdict(problems, "given back to the driver on unload", **numbers)


@check("vllm_serve_fp8_kv_speculative", "vllm_serve on the GPU with kv_cache_dtype fp8 and ngram speculative "
       "decoding: starts and answers")  # fmt: skip
async def vllm_serve_fp8_kv_speculative(work: Path) -> Result:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return skipped("vLLM is not installed in this image (see vllm_in_process)")
    speculative = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    entry = {"backend": "vllm_serve", "source": str(hf_llama(work)), "tasks": ["chat", "completion"],
             "options": {"kv_cache_dtype": "fp8", "speculative": speculative, "max_model_len": 512,
                         "gpu_memory_utilization": 0.5}}  # fmt: skip
    pool = pool_for({"vllm-fp8": entry}, work)
    try:
        await pool.load("vllm-fp8")
        reply = await greedy(pool, "vllm-fp8")
    finally:
        await pool.close()
    return verdict([] if reply else ["no answer"], "fp8 KV cache with ngram speculation answered", reply=reply)


@check("transformers_cuda", "transformers on cuda, two models at once (scripts/gpu_memory_check.py): measured "
       "VRAM adds up, unloading gives it back to the driver (torch's cache released)")  # fmt: skip
async def transformers_cuda(work: Path) -> Result:
    from gpu_memory_check import check as memory_check

    summary = await memory_check(hf_llama(work), "cuda")
    keep = ("models", "gpu_account", "gpu_account_after_unloading_gpu_a", "load_both_s", "reply")
    numbers = {key: summary.get(key) for key in keep}
    return verdict(list(summary["problems"]), "measured, counted once, freed on unload", **numbers)


@check("transformers_device_map_auto", "transformers with device_map: auto: placed on cuda:0 (the load's "
       "placement), greedy answer equal to device: cuda's")  # fmt: skip
async def transformers_device_map_auto(work: Path) -> Result:
    from modelpool.backends.transformers.backend import TransformersOptions

    if "device_map" not in TransformersOptions.model_fields:
        return skipped("this modelpool has no `device_map` option on the transformers backend")
    folder, replies, placement = hf_llama(work), {}, None
    for name, options in (("mapped", {"device_map": "auto"}), ("plain", {"device": "cuda"})):
        entry = {"backend": "transformers", "source": str(folder), "tasks": ["chat", "completion"],
                 "options": {**options, "max_model_len": 512}}  # fmt: skip
        pool = pool_for({name: entry}, work)
        try:
            await pool.load(name)
            replies[name] = await greedy(pool, name)
            if name == "mapped":
                replicas = pool.slot(name).status().replicas
                placement = getattr(replicas[0], "placement", None) if replicas else None
        finally:
            await pool.close()
    problems = []
    if not placement or any(not str(device).startswith("cuda") for device in dict(placement).values()):
        problems.append(f"placement {placement!r}: not all on a GPU")
    if not replies["mapped"] or replies["mapped"] != replies["plain"]:
        problems.append(f"device_map auto answered {replies['mapped']!r}, device cuda {replies['plain']!r}")
    return verdict(problems, "placed on the GPU by accelerate, same answer as device: cuda",
                   placement=placement, replies=replies)  # fmt: skip


@check("vllm_in_process", "backend: vllm (vLLM's async engine in process) on the random Llama: answers greedily")
async def vllm_in_process(work: Path) -> Result:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return skipped("vLLM is not installed in this image, and its wheel (~400 MB with its CUDA kernels) is too "
                       "big to carry to a machine with no network")  # fmt: skip
    from modelpool.backends.registry import BACKENDS

    if "vllm" not in BACKENDS:
        return skipped("this modelpool has no `vllm` backend")
    entry = {"backend": "vllm", "source": str(hf_llama(work)), "tasks": ["chat", "completion"],
             "options": {"max_model_len": 512, "gpu_memory_utilization": 0.5}}  # fmt: skip
    pool = pool_for({"vllm-gpu": entry}, work)
    try:
        await pool.load("vllm-gpu")
        first, second = await greedy(pool, "vllm-gpu"), await greedy(pool, "vllm-gpu")
        measured = pool.memory().models["vllm-gpu"].measured_gpu_bytes
    finally:
        await pool.close()
    problems = [] if first and first == second else [f"greedy answers differ or are empty: {first!r} / {second!r}"]
    return verdict(problems, "vLLM in process answered", measured_gpu_mib=measured // MiB, reply=first)


@check("faster_whisper_cuda", "faster_whisper (CTranslate2) on CUDA")
async def faster_whisper_cuda(work: Path) -> Result:
    import importlib.util

    if importlib.util.find_spec("ctranslate2") is None:
        return skipped("CTranslate2 is not in this image; its wheel is built against CUDA 12's cuBLAS, which this "
                       "CUDA 13 image lacks, so carrying it would not run either")  # fmt: skip
    import ctranslate2

    count = ctranslate2.get_cuda_device_count()
    return verdict([] if count else ["CTranslate2 sees no CUDA device"], "CTranslate2 sees the GPU", devices=count)


# --- running them --------------------------------------------------------------------------


def run_one(name: str, work: Path) -> Result:
    """In this process (a child of `run_all`)."""
    began = time.monotonic()
    try:
        result = asyncio.run(CHECKS[name].run(work))
    except Exception as exc:  # a check reports, whatever broke
        tail = "".join(traceback.format_exception(exc)[-3:]).strip()
        result = failed(f"{type(exc).__name__}: {exc}", traceback=tail[-2000:])
    result.seconds = round(time.monotonic() - began, 1)
    return result


def run_child(name: str, work: Path, log: Path, timeout_s: float) -> Result:
    argv = [sys.executable, __file__, "--one", name, "--work", str(work)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return failed(f"did not finish in {timeout_s:.0f} s")
    with log.open("a", encoding="utf-8") as handle:
        handle.write(f"===== {name} (exit {done.returncode})\n{done.stdout}\n{done.stderr}\n")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return failed(f"the check's process exited {done.returncode} without a result", stderr=done.stderr[-1500:])
    return Result(**json.loads(lines[-1]))


def no_gpu_reason(dry_run: bool) -> str | None:
    if dry_run:
        return "no GPU (dry run)"
    if shutil.which("nvidia-smi") is None:
        return "no GPU (no nvidia-smi)"
    from modelpool.runtime.gpu_probe import nvml_gpus

    return None if nvml_gpus() else "no GPU (NVML sees none)"


def report(results: dict[str, Result], build: dict[str, Any], out: Path, seconds: float) -> dict[str, Any]:
    counts = {status: sum(r.status == status for r in results.values()) for status in ("pass", "fail", "skip")}
    data = {"ok": counts["fail"] == 0, "counts": counts, "seconds": round(seconds, 1), "build": build,
            "checks": {name: {"what": CHECKS[name].what, **asdict(r)} for name, r in results.items()}}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    lines = [f"# GPU check: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped "
             f"in {seconds:.0f} s", "", "| check | result | s | detail |", "|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        lines.append(f"| {name} | {r.status} | {r.seconds} | {r.detail.replace('|', '/')} |")
    if build:
        lines += ["", f"llama-cpp-python CUDA build: {json.dumps(build)}"]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description="modelpool's GPU checks (issue 32)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ".gpu/out"))
    parser.add_argument("--work", type=Path, default=Path(".gpu/work"))
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS), default=None)
    parser.add_argument("--dry-run", action="store_true", help="report every check as skipped (no GPU used)")
    parser.add_argument("--build-json", type=Path, help="the CUDA build's record, from gpu_check.sh")
    parser.add_argument("--deadline-s", type=float, default=float(CHECK_TIMEOUT_S * len(CHECKS)),
                        help="seconds for all checks; those that cannot start in time are skipped")  # fmt: skip
    parser.add_argument("--one", choices=sorted(CHECKS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(asdict(run_one(args.one, args.work)), default=str))
        return 0
    began = time.monotonic()
    build = json.loads(args.build_json.read_text()) if args.build_json and args.build_json.is_file() else {}
    reason = no_gpu_reason(args.dry_run)
    results = {}
    for name in args.only or list(CHECKS):
        left = args.deadline_s - (time.monotonic() - began)
        if reason:
            results[name] = skipped(reason)
        elif left < 20:
            results[name] = skipped(f"out of time (the run's {args.deadline_s:.0f} s were spent)")
        else:
            results[name] = run_child(name, args.work, args.out / "gpu_check.log", min(CHECK_TIMEOUT_S, left))
        print(f"{name}: {results[name].status} ({results[name].seconds} s) {results[name].detail}", flush=True)
    data = report(results, build, args.out, time.monotonic() - began)
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
