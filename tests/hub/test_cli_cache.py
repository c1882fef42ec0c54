"""`modelpool cache ls|rm` on a real cache: entries pulled from the stand-in hub and work dir
folders named as the converters name them; removal stays inside those folders, and a model
loaded on a running server keeps its files unless --force."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modelpool.cli.main import app
from modelpool.config import load_config
from modelpool.hub.access import HubAccess
from modelpool.hub.pull import plan_pull, pull
from modelpool.hub.reference import parse_reference
from modelpool.server.app import create_app
from tests import hub_repos as r
from tests.hub_standin import HubStandin
from tests.live_server import live_server

runner = CliRunner()


def _catalog(tmp_path: Path, cache: Path) -> dict[str, Any]:
    source = f"hf:{r.GGUF_REPO}:Q8_0"
    models = {
        "hubbed": {"backend": "llama_cpp", "source": source, "preload": True, "options": {"n_ctx": 256}},
        "conv": {"backend": "transformers", "source": source, "preload": False},
    }
    return {
        "models": models,
        "enabled_models": ["hubbed"],
        "hf_cache_dir": str(cache),
        "work_dir": str(tmp_path / "work"),
    }


@pytest.fixture
def catalog(hub_standin: HubStandin, hub_env: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A config file, its hub cache holding the catalog's GGUF and a repo it does not use,
    and a work dir with the current conversion of `conv`, a stale one and a transcript store."""
    access = HubAccess.from_env()
    gguf = pull(plan_pull(parse_reference(f"hf:{r.GGUF_REPO}:Q8_0"), "llama_cpp", access), access)
    pull(plan_pull(parse_reference(f"hf:{r.HF_REPO}"), "transformers", access), access)
    stat = gguf.stat()
    work = tmp_path / "work"
    for folder in (f"gguf-to-hf/{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}", "gguf-to-hf/old-1-2", "transcripts/k"):
        (work / folder).mkdir(parents=True)
        (work / folder / "config.json").write_text("{}")
    data = _catalog(tmp_path, hub_env)
    path = tmp_path / "modelpool.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def _rows(output: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: line.split()[1:] for line in output.splitlines()[1:] if line.strip() and ":" in line.split()[0]
    }


def test_ls_lists_sizes_and_users(catalog: tuple[Path, dict[str, Any]]) -> None:
    config, _ = catalog
    listed = runner.invoke(app, ["cache", "ls", "--config", str(config)])
    assert listed.exit_code == 0, listed.output
    rows = _rows(listed.output)
    assert rows[f"hf:{r.GGUF_REPO}"][:2] == ["93.8", "MiB"]
    assert {user.strip(",") for user in rows[f"hf:{r.GGUF_REPO}"][2:]} == {"hubbed", "conv"}
    current = next(name for name in rows if name.startswith("work:gguf-to-hf/SmolLM2"))
    assert rows[current][2:] == ["conv"] and rows["work:gguf-to-hf/old-1-2"][2:] == ["-"]
    assert f"hf:{r.HF_REPO}" not in rows and not any("transcripts" in name for name in rows)
    every = _rows(runner.invoke(app, ["cache", "ls", "--all", "--config", str(config)]).output)
    assert every[f"hf:{r.HF_REPO}"][2:] == ["-"]


@pytest.mark.parametrize(
    "entry",
    ["work:gguf-to-hf/..", "work:gguf-to-hf/../transcripts", "work:transcripts/k", "work:/etc", "hf:../x", "hf:a/b/c",
     "hf:nobody/nothing", "/tmp", "work:gguf-to-hf/missing"],
)  # fmt: skip
def test_rm_refuses_what_is_not_an_entry(catalog: tuple[Path, dict[str, Any]], entry: str, tmp_path: Path) -> None:
    config, _ = catalog
    before = sorted(p for p in tmp_path.rglob("*"))
    removed = runner.invoke(app, ["cache", "rm", entry, "--config", str(config), "--url", "http://127.0.0.1:9"])
    assert removed.exit_code == 1, removed.output
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_rm_entries_and_a_models_files(catalog: tuple[Path, dict[str, Any]], hub_env: Path, tmp_path: Path) -> None:
    config, _ = catalog
    args = ["--config", str(config), "--url", "http://127.0.0.1:9"]  # nothing listens there
    stale = runner.invoke(app, ["cache", "rm", "work:gguf-to-hf/old-1-2", *args])
    assert stale.exit_code == 0 and "removed work:gguf-to-hf/old-1-2" in stale.output
    assert "not checked for loaded models" in stale.output
    gone = runner.invoke(app, ["cache", "rm", "--model", "conv", *args])
    assert gone.exit_code == 0, gone.output
    assert not (hub_env / f"models--{r.GGUF_REPO.replace('/', '--')}").exists()
    assert not list((tmp_path / "work" / "gguf-to-hf").iterdir())
    assert (tmp_path / "work" / "transcripts" / "k" / "config.json").is_file()
    assert (hub_env / f"models--{r.HF_REPO.replace('/', '--')}").is_dir()


async def test_rm_refuses_files_of_a_loaded_model(catalog: tuple[Path, dict[str, Any]], hub_env: Path) -> None:
    config, data = catalog
    application = create_app(load_config(None, cli=data, environ={}))
    async with live_server(application) as url:
        for slot in application.state.pool.slots():
            await slot.ensure_ready(None, explicit=True)
        args = ["cache", "rm", f"hf:{r.GGUF_REPO}", "--config", str(config), "--url", url]
        refused = await asyncio.to_thread(runner.invoke, app, args)
        assert refused.exit_code == 1 and f"used by hubbed, loaded at {url}" in refused.output
        assert (hub_env / f"models--{r.GGUF_REPO.replace('/', '--')}").is_dir()
        forced = await asyncio.to_thread(runner.invoke, app, [*args, "--force"])
        assert forced.exit_code == 0, forced.output


def test_rm_needs_one_to_64_entries(tmp_path: Path) -> None:
    for args in ([], ["work:ct2/x"] * 65):
        refused = runner.invoke(app, ["cache", "rm", *args, "--url", "http://127.0.0.1:9"])
        assert refused.exit_code == 2 and "name 1 to 64 entries" in refused.output
    unknown = runner.invoke(app, ["cache", "rm", "--model", "no-such-model"])
    assert unknown.exit_code == 2 and "no model 'no-such-model'" in unknown.output
