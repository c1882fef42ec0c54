"""The OpenMP wait settings `modelpool serve` starts with, against libgomp's own, side by side.

`modelpool serve` gives itself OMP_WAIT_POLICY=ACTIVE and GOMP_SPINCOUNT=300000 (unless the
operator set either; `config.environment.OPENMP_WAITS` says why). This runs the starter as
shipped both ways, as real `modelpool serve` subprocesses one at a time:

  * chat alone: the starter chat model only (one OpenMP pool: llama.cpp's);
  * make serve: every preloaded starter model (the chat model, the embedder, Whisper, Piper),
    so two engines hold OpenMP pools (llama.cpp's and Whisper's CTranslate2's);

each on a quiet machine and beside `--busy` processes that spin on the CPU (another tenant).
"libgomp defaults" is the same server started with GOMP_SPINCOUNT=300000, which is libgomp's
own default (so modelpool leaves the settings alone and libgomp behaves as shipped).

Measured: one greedy streamed chat at a time, 128 tokens with `ignore_eos`, `--requests`
after a warm-up (tokens/s, median); with `make serve` also Whisper's time for 23 s of Piper
speech (median of 3 after a warm-up), so that a faster chat model is not bought with a slower
transcriber. The two variants alternate (ABBA over `--pairs`) so the machine's drift falls on
both alike.

Run: `.venv/bin/python -m benchmarks.bench_openmp_waits` (~6 min on 2 cores; `--pairs 2`, ~11).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import httpx

from benchmarks.bench_llm_concurrency import STARTER, modelpool_argv, running
from benchmarks.bench_serving import free_port

LIBGOMP_DEFAULTS = {"GOMP_SPINCOUNT": "300000"}
VARIANTS = {"libgomp defaults": LIBGOMP_DEFAULTS, "modelpool's waits": {}}
SETUPS = {"chat alone": [STARTER], "make serve": None}  # None: every preloaded starter model
CHAT = {
    "model": STARTER,
    "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
    "max_tokens": 128,
    "temperature": 0,
    "ignore_eos": True,
}
SPEECH = "The quick brown fox jumps over the lazy dog. " * 6


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes that spin on the CPU until stopped."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def chat_rate(url: str, requests: int) -> float:
    """Median tokens/s of `requests` greedy chats one after another, after one to warm up."""
    rates = []
    for i in range(requests + 1):
        started = time.perf_counter()
        reply = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=600)
        reply.raise_for_status()
        if i:
            rates.append(reply.json()["usage"]["completion_tokens"] / (time.perf_counter() - started))
    return statistics.median(rates)


def transcription_s(url: str) -> float:
    """Median seconds Whisper takes for ~23 s of Piper's speech (3 after a warm-up)."""
    speech = httpx.post(f"{url}/v1/audio/speech", json={"model": "piper-en-us-joe", "input": SPEECH,
                                                          "response_format": "wav"}, timeout=300)  # fmt: skip
    speech.raise_for_status()
    times = []
    for i in range(4):
        started = time.perf_counter()
        text = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-tiny.en"},
                          files={"file": ("speech.wav", speech.content, "audio/wav")}, timeout=300)  # fmt: skip
        text.raise_for_status()
        if i:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(setup: str, env: dict[str, str], args: argparse.Namespace, directory: Path) -> tuple[float, float | None]:
    config: dict[str, object] = {"state_dir": str(directory / "state")}
    if SETUPS[setup] is not None:
        config["enabled_models"] = SETUPS[setup]
    path = directory / "config.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    port = free_port()
    argv = modelpool_argv(port, directory, path)
    with running(argv, f"http://127.0.0.1:{port}/readyz", directory / "server.log", args.start_timeout, env):
        url = f"http://127.0.0.1:{port}"
        rate = chat_rate(url, args.requests)
        whisper = transcription_s(url) if setup == "make serve" else None
    return rate, whisper


def order(pairs: int) -> list[str]:
    """ABBA: libgomp's, ours, ours, libgomp's, ..."""
    names = list(VARIANTS)
    return [name for pair in range(pairs) for name in (names if pair % 2 == 0 else names[::-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the loaded runs")
    parser.add_argument("--pairs", type=int, default=1, help="turns of each variant per setup and load")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated: " + ", ".join(SETUPS))
    args = parser.parse_args()
    if any(name in os.environ for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        raise SystemExit("unset OMP_WAIT_POLICY and GOMP_SPINCOUNT: this compares them")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-omp-") as tmp:
        for setup in args.setups.split(","):
            for busy in (0, args.busy):
                figures: dict[str, list[tuple[float, float | None]]] = {name: [] for name in VARIANTS}
                with busy_processes(busy):
                    for name in order(args.pairs):
                        figures[name].append(measure(setup, VARIANTS[name], args, Path(tmp)))
                        print(f"  {setup}, {busy} busy, {name}: {figures[name][-1]}", file=sys.stderr)
                rows.append((setup, busy, figures))
    print(f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}\n")
    print("| setup | busy processes | " + " | ".join(f"{n} chat tok/s" for n in VARIANTS) + " | ratio "
          "| Whisper s, " + " / ".join(VARIANTS) + " |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for setup, busy, figures in rows:
        rates = [statistics.median(r for r, _ in figures[name]) for name in VARIANTS]
        whispers = [[w for _, w in figures[name] if w is not None] for name in VARIANTS]
        whisper = " / ".join(f"{statistics.median(w):.2f}" for w in whispers) if all(whispers) else "–"
        print(f"| {setup} | {busy} | " + " | ".join(f"{r:.1f}" for r in rates) + f" | {rates[1] / rates[0]:.2f}× "
              f"| {whisper} |")  # fmt: skip


if __name__ == "__main__":
    main()
