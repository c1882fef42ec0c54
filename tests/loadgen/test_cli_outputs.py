"""`modelpool bench --json/--chart` to a place it cannot write: refused before any request
is sent (exit 2 naming the setting), not a traceback after the whole run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from modelpool.cli import bench as bench_cli
from modelpool.cli.main import app


def refuse_to_run(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the run started")


@pytest.mark.parametrize("setting", ["--json", "--chart"])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(
    setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_cli, "run_sweep", refuse_to_run)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    a_folder = tmp_path / "out.svg"
    a_folder.mkdir()
    for path in (tmp_path / "missing" / "run.svg", a_file / "run.svg", a_folder):
        args = ["bench", "http://127.0.0.1:9", "-m", "m", "--no-progress", setting, str(path)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (path, result.output, result.exception)
        assert f"{setting.lstrip('-')}: " in result.output and str(path) in result.output.replace("\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "out.svg"]  # the check left nothing behind
