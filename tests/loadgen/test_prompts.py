"""Which prompt each request sends (in turn, counting on across warm-up and levels), and the
prompt files `modelpool bench --prompt-file` reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from modelpool.cli.bench import _prompt_file
from modelpool.loadgen import LoadPlan, LoadSpec, LoadSpecError, run_sweep
from tests.loadgen.test_bad_servers import http, read_body, stub


async def test_prompts_are_taken_in_turn_across_warmup_and_levels():
    sent: list[str] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = json.loads(await read_body(reader))
            sent.append(body["messages"][0]["content"])
            usage = {"completion_tokens": 1, "prompt_tokens": 1}
            reply = json.dumps({"choices": [{"message": {"content": "x"}}], "usage": usage}).encode()
            writer.write(http("200 OK", "application/json", reply))
            await writer.drain()

    async with stub(echo) as url:
        spec = LoadSpec(url, "m", prompts=("a", "b", "c"), stream=False)
        warmup, runs = await run_sweep(spec, LoadPlan(concurrency=(1, 1), requests=2, warmup=1))
    assert sent == ["a", "b", "c", "a", "b"]
    assert [r.index for r in warmup] == [0] and [[r.index for r in run.records] for run in runs] == [[1, 2], [3, 4]]
    assert all(run.summary.output_tokens == 2 and run.summary.tokens_from_usage for run in runs)


@pytest.mark.parametrize(
    ("name", "text", "prompts"),
    [
        ("p.txt", "one\n\ntwo\n", ["one", "two"]),
        ("p.jsonl", '{"prompt": "one"}\n{"text": "two"}\n', ["one", "two"]),
        ("p.json", '["one", "two"]', ["one", "two"]),
    ],
)
def test_prompt_files(tmp_path: Path, name: str, text: str, prompts: list[str]):
    path = tmp_path / name
    path.write_text(text)
    assert _prompt_file(path) == prompts


@pytest.mark.parametrize(
    ("name", "text"),
    [("p.jsonl", '{"other": 1}\n'), ("p.json", '{"a": 1}'), ("p.json", "[1, 2]"), ("p.json", "not json")],
)
def test_bad_prompt_files_name_the_option(tmp_path: Path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LoadSpecError, match=r"^prompt-file"):
        _prompt_file(path)


def test_a_missing_prompt_file_names_the_option(tmp_path: Path):
    with pytest.raises(LoadSpecError, match=r"^prompt-file: cannot read"):
        _prompt_file(tmp_path / "absent.txt")
