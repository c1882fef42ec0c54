"""`modelpool bench` and its library against a real modelpool server (the session's starter
app on a real socket): every kind, the numbers the server's usage states, the sweep's
levels, the JSON and chart files, and a refusing server's 401s counted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from PIL import Image

from modelpool.config.schema import AuthConfig
from modelpool.loadgen import LoadPlan, LoadSpec, run_sweep
from modelpool.server.auth import KeyRing
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL, serving
from tests.live_server import live_server

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
async def server_url(app: FastAPI) -> AsyncIterator[str]:
    async with live_server(app, lifespan=False) as url:
        yield url


async def bench(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The real CLI in a subprocess (the server runs in this test's event loop)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "modelpool", "bench", *args, "--no-progress",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})},
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 180)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_chat_streams_count_what_the_usage_says(server_url: str) -> None:
    spec = LoadSpec(server_url, CHAT_MODEL, prompts=("Hi.", "Count to ten."), max_tokens=6, ignore_eos=True)
    warmup, runs = await run_sweep(spec, LoadPlan(concurrency=(1, 3), requests=4, warmup=1))
    assert len(warmup) == 1 and [len(run.records) for run in runs] == [4, 4]
    for run in runs:
        assert run.summary.errors == {} and run.summary.succeeded == 4
        assert all(r.tokens_from_usage and r.output_tokens == 6 for r in run.records)  # ignore_eos: all 6
        assert all(r.ttft_s is not None and 0 < r.ttft_s <= r.latency_s for r in run.records)
        assert all(len(r.chunk_gaps_s) <= 5 for r in run.records)  # at most one gap between each of 6 tokens
        assert run.summary.output_tokens == 24 and run.summary.concurrency in (1, 3)
        assert run.summary.prompt_tokens > 0


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_unstreamed_replies_take_their_tokens_from_usage(server_url: str, kind: Any) -> None:
    spec = LoadSpec(server_url, CHAT_MODEL, kind=kind, stream=False, max_tokens=5, ignore_eos=True)
    _, (run,) = await run_sweep(spec, LoadPlan(concurrency=(2,), requests=2, warmup=0))
    assert run.summary.succeeded == 2 and run.summary.output_tokens == 10 and run.summary.tokens_from_usage


async def test_embeddings_transcription_and_speech(server_url: str) -> None:
    from modelpool.loadgen.audio import tone_wav

    embed = LoadSpec(server_url, EMBED_MODEL, kind="embeddings", prompts=("one", "two words"))
    _, (run,) = await run_sweep(embed, LoadPlan(concurrency=(4,), requests=8, warmup=0))
    assert run.summary.errors == {} and len(run.records) == 8
    assert all(r.prompt_tokens for r in run.records)
    stt = LoadSpec(server_url, STT_MODEL, kind="transcription", audio=tone_wav(0.5))
    _, (run,) = await run_sweep(stt, LoadPlan(concurrency=(2,), requests=2, warmup=0))
    assert run.summary.errors == {} and run.summary.succeeded == 2
    tts = LoadSpec(server_url, TTS_MODEL, kind="speech", prompts=("Hello there.",))
    _, (run,) = await run_sweep(tts, LoadPlan(concurrency=(1,), requests=2, warmup=0))
    assert run.summary.errors == {}
    for record in run.records:
        assert record.output_bytes > 44  # a WAV header and samples
        assert record.ttft_s is not None and record.ttft_s <= record.latency_s


async def test_cli_sweep_writes_records_table_and_charts(server_url: str, tmp_path: Path) -> None:
    out, svg = tmp_path / "run.json", tmp_path / "run.svg"
    code, stdout, stderr = await bench(
        server_url, "-m", CHAT_MODEL, "--concurrency", "1,2", "--requests", "3", "--max-tokens", "4",
        "--ignore-eos", "--warmup", "1", "--json", str(out), "--chart", str(svg),
    )  # fmt: skip
    assert code == 0, stderr
    report = json.loads(out.read_text())
    assert [level["summary"]["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert len(level["records"]) == 3 and level["summary"]["output_tokens"] == 12
        assert all(r["output_tokens"] == 4 and r["error"] is None for r in level["records"])
    assert len(report["warmup"]) == 1 and report["spec"]["api_key"] is None
    assert ElementTree.parse(svg).getroot().tag.endswith("svg")
    rows = [line for line in stdout.splitlines() if re.match(r"^│\s+[12] │\s+3/3 │", line)]
    assert len(rows) == 2, stdout  # one row per level, each 3 of 3 requests
    png = tmp_path / "embed.png"
    code, stdout, stderr = await bench(
        server_url, "-m", EMBED_MODEL, "--kind", "embeddings", "--requests", "4", "--concurrency", "2,4",
        "--chart", str(png),
    )  # fmt: skip
    assert code == 0, stderr
    with Image.open(png) as image:
        assert image.format == "PNG"


async def test_cli_refuses_out_of_bounds_settings(server_url: str) -> None:
    for args, named in [
        (["--concurrency", "2048"], "concurrency"),
        (["--requests", "0"], "requests"),
        (["--kind", "images"], "kind"),
        (["--chart", "x.jpg"], "chart"),
        (["--api-key-env", "NO_SUCH_BENCH_KEY"], "NO_SUCH_BENCH_KEY"),
    ]:
        code, _, stderr = await bench(server_url, "-m", CHAT_MODEL, *args)
        assert code == 2 and named in stderr, (args, stderr)


async def test_a_wrong_key_is_counted_as_401s_and_never_printed(tmp_path: Path) -> None:
    auth = {"keys": [{"name": "bench", "key_env": "BENCH", "scopes": ["inference"]}]}
    keys = KeyRing.from_config(AuthConfig.model_validate(auth), {"BENCH": "sk-bench-right"})
    async with serving({"enabled_models": [EMBED_MODEL], "auth": auth}, keys=keys) as (app, _):  # noqa: SIM117
        async with live_server(app, lifespan=False) as url:  # needs the app from the line above
            base = [url, "-m", EMBED_MODEL, "--kind", "embeddings", "--requests", "3", "--concurrency", "1,3"]
            out = tmp_path / "wrong.json"
            code, stdout, stderr = await bench(*base, "--api-key-env", "KEY", "--json", str(out), env={"KEY": "sk-bad"})
            assert code == 1 and "no request succeeded" in stderr
            levels = json.loads(out.read_text())["levels"]
            assert [level["summary"]["errors"] for level in levels] == [{"http_401": 3}, {"http_401": 3}]
            assert "sk-bad" not in stdout + stderr + out.read_text()
            code, stdout, stderr = await bench(*base, "--api-key-env", "KEY", env={"KEY": "sk-bench-right"})
            assert code == 0 and "sk-bench-right" not in stdout + stderr
