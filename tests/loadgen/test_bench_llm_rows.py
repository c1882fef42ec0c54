"""benchmarks/bench_llm_concurrency.py's transformers and vLLM rows: the configs it writes are
ones modelpool accepts (a typo in an option would only show after minutes of vLLM start-up),
and the side-by-side table reads the numbers of both rows."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from benchmarks.bench_llm_concurrency import (
    MODEL,
    Level,
    Result,
    against_native_by_run,
    engines_side_by_side,
    launches,
    schedule,
    write_modelpool_config,
)

from modelpool.backends.registry import parse_options
from modelpool.config.loader import validate_config


def bench_args(vllm_python: Path) -> argparse.Namespace:
    return argparse.Namespace(
        binary=Path("/nonexistent/llama-server"), threads=None, streams=16, more_streams=[32], baseline_tree=None,
        vllm_python=vllm_python, start_timeout=600.0,
    )  # fmt: skip


@pytest.mark.parametrize("server", ["transformers", "vllm"])
def test_the_rows_config_is_valid_for_its_backend(server: str, tmp_path: Path) -> None:
    weights = tmp_path / "hf-folder"
    weights.mkdir()
    plan = launches(bench_args(tmp_path / "python"), tmp_path / "model.gguf", tmp_path)[server]
    assert plan.model_config is not None
    config = dict(plan.model_config)
    if plan.weights is not None:  # vllm: its folder comes at start; stand one in (converting needs minutes)
        config["source"] = str(weights)
    write_modelpool_config(tmp_path, config)
    model = validate_config(json.loads((tmp_path / "modelpool.yaml").read_text())).models[MODEL]
    options = parse_options(model)
    if server == "vllm":
        assert model.backend == "vllm_serve" and model.source == str(weights)
        assert options.model_dump()["dtype"] == "float32" and options.model_dump()["max_num_seqs"] >= 32
        assert options.model_dump()["python"] == str(tmp_path / "python")
    else:
        assert options.model_dump()["max_batch_size"] >= 32  # room for the 32-stream level


def test_side_by_side_ratio_per_level(capsys: pytest.CaptureFixture[str]) -> None:
    def row(server: str, scale: float) -> Result:
        return Result(server, server, single_tps=10 * scale, concurrent_tps=100 * scale,
                      more={32: Level(150 * scale, math.nan, math.nan)})  # fmt: skip

    args = argparse.Namespace(streams=16, more_streams=[32])
    engines_side_by_side([row("transformers", 1.0), row("vllm", 2.0)], args)
    table = capsys.readouterr().out
    assert "| 1 stream | 16 streams | 32 streams |" in table
    assert "| ratio | 0.50× | 0.50× | 0.50× |" in table
    engines_side_by_side([row("transformers", 1.0)], args)  # no vllm row: no table
    assert capsys.readouterr().out == ""


def test_side_by_side_with_turns_compares_each_turn_and_gives_the_median(capsys: pytest.CaptureFixture[str]) -> None:
    def row(server: str, run: int, scale: float) -> Result:
        return Result(server, server, run=run, single_tps=10 * scale, concurrent_tps=100 * scale,
                      more={32: Level(150 * scale, math.nan, math.nan)})  # fmt: skip

    args = argparse.Namespace(streams=16, more_streams=[32])
    # The machine slows in turn 2 for both; turn 3 has no vLLM row.
    results = [row("transformers", 0, 1.0), row("vllm", 0, 1.25), row("vllm", 1, 0.5), row("transformers", 1, 0.5),
               row("transformers", 2, 1.0)]  # fmt: skip
    engines_side_by_side(results, args)
    table = capsys.readouterr().out
    assert "| turn 1 | 0.80× | 0.80× | 0.80× |" in table and "| turn 2 | 1.00× | 1.00× | 1.00× |" in table
    assert "| turn 3 |" not in table and "| median | 0.90× | 0.90× | 0.90× |" in table
    against_native_by_run(results, 16)  # no native row: no table of ratios to it
    assert capsys.readouterr().out == ""


def test_repeated_turns_alternate_and_compare_each_with_native_in_its_own_turn(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert schedule(["native", "starter"], 0, repeat=3) == [
        ("native", 0), ("starter", 0), ("starter", 1), ("native", 1), ("native", 2), ("starter", 2),
    ]  # fmt: skip
    assert schedule(["native", "starter"], 0) == [("native", 0), ("starter", 0)]

    def turn(server: str, run: int, tps: float, ttft: float) -> Result:
        return Result(server, server, run=run, single_tps=tps / 2, concurrent_tps=tps, ttft_p50=ttft)

    # The machine slows in turn 2: native and the starter alike; turn 3's starter failed.
    results = [turn("native", 0, 100, 1.0), turn("starter", 0, 110, 1.2), turn("starter", 1, 45, 1.0),
               turn("native", 1, 50, 2.0), turn("native", 2, 100, 1.0),
               Result("starter", "starter", run=2, status="failed")]  # fmt: skip
    against_native_by_run(results, 16)
    table = capsys.readouterr().out
    assert "| modelpool | 1 | 1.10× | 1.10× | 1.20× |" in table
    assert "| modelpool | 2 | 0.90× | 0.90× | 0.50× |" in table
    assert "| modelpool | 3 |" not in table
    assert "| modelpool | median | 1.00× | 1.00× | 0.85× |" in table
    assert "16 streams ≥ 1.0×: 1.00× — met; TTFT p50 at 16 ≤ 1.5×: 0.85× — met." in table
